#include "plot/memory_chart.hpp"

#include <algorithm>
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "common/units.hpp"
#include "trace/report.hpp"

namespace actpage::plot {
namespace {

constexpr int kScale = 2;  // text scale: 10x14-pixel characters
constexpr int kLeft = 130;
constexpr int kLegendWidth = 360;
constexpr int kTop = 64;
constexpr int kLaneHeight = 18;
constexpr int kLaneGap = 6;

std::string gib_label(double gib) {
  char text[32];
  std::snprintf(text, sizeof text, gib < 10 ? "%.1f GiB" : "%.0f GiB", gib);
  return text;
}

std::string ms_label(double ms) {
  char text[32];
  std::snprintf(text, sizeof text, ms < 10 ? "%.1f" : "%.0f", ms);
  return text;
}

// A tick step of 1, 2 or 5 times a power of ten giving about `count` ticks over `span`.
double nice_step(double span, int count) {
  if (span <= 0) return 1;
  const double raw = span / count;
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  for (const double factor : {1.0, 2.0, 5.0, 10.0}) {
    if (raw <= factor * power) return factor * power;
  }
  return 10 * power;
}

void draw_panel(Canvas& canvas, const trace::Timeline& t, int top, const ChartOptions& options) {
  const Rgb text = ChartColours::text;
  const int right = options.width - kLegendWidth;
  const int plot_top = top + kTop;
  const int lanes_height = 3 * (kLaneHeight + kLaneGap);
  const int plot_bottom = top + options.panel_height - 60 - lanes_height;
  const int plot_width = right - kLeft;
  const int plot_height = plot_bottom - plot_top;

  // Title and the figures of the peak.
  std::string title = "Device memory: " + t.source + " (rank " + std::to_string(t.rank) + ")";
  if (t.window_iteration) {
    title += ", iteration " + std::to_string(*t.window_iteration + 1) + " of " + std::to_string(t.iterations.size());
  } else {
    title += ", whole trace";
  }
  canvas.text(kLeft, top + 12, title, text, kScale);
  std::string subtitle = "peak resident " + format_bytes(t.peak_resident_bytes) + " at " +
                         trace::format_duration(t.peak_time_ns);
  if (!t.range_at_peak.empty()) subtitle += " in " + t.range_at_peak;
  if (t.offloaded_at_peak_bytes > 0) subtitle += ", " + format_bytes(t.offloaded_at_peak_bytes) + " off the device";
  if (t.peak_device_used_bytes > 0) subtitle += "; device in use peak " + format_bytes(t.peak_device_used_bytes);
  canvas.text(kLeft, top + 36, subtitle, text, kScale);

  // Scales.
  const double span_ns = static_cast<double>(std::max<std::uint64_t>(t.end_ns - t.begin_ns, 1));
  std::uint64_t max_bytes = 1;
  for (const auto& p : t.points) max_bytes = std::max(max_bytes, p.resident_total + p.offloaded);
  for (const auto& s : t.device_used) max_bytes = std::max(max_bytes, s.used_bytes);
  const double max_gib = static_cast<double>(max_bytes) / static_cast<double>(GiB) * 1.08;
  const double y_step = nice_step(max_gib, 6);
  const double y_top = std::ceil(max_gib / y_step) * y_step;
  auto y_of = [&](std::uint64_t bytes) {
    const double gib = static_cast<double>(bytes) / static_cast<double>(GiB);
    return plot_bottom - static_cast<int>(std::lround(gib / y_top * plot_height));
  };
  auto x_of = [&](std::uint64_t time_ns) {
    const double clamped = std::clamp(static_cast<double>(time_ns) - static_cast<double>(t.begin_ns), 0.0, span_ns);
    return kLeft + static_cast<int>(std::lround(clamped / span_ns * (plot_width - 1)));
  };

  // Grid and y labels.
  for (double gib = 0; gib <= y_top + 1e-9; gib += y_step) {
    const int y = plot_bottom - static_cast<int>(std::lround(gib / y_top * plot_height));
    canvas.line(kLeft, y, right - 1, y, ChartColours::grid);
    const std::string label = gib_label(gib);
    canvas.text(kLeft - 8 - Canvas::text_width(label, kScale), y - Canvas::text_height(kScale) / 2, label, text, kScale);
  }

  // The stacked areas, one pixel column at a time: the state with the most bytes in the column
  // (so no peak falls between columns), else the state in effect at its start.
  std::size_t next = 0;
  const trace::Timeline::Point* current = nullptr;
  for (int column = 0; column < plot_width; ++column) {
    const double column_end = static_cast<double>(t.begin_ns) + span_ns * (column + 1) / plot_width;
    const trace::Timeline::Point* shown = current;
    std::uint64_t shown_total = current ? current->resident_total + current->offloaded : 0;
    while (next < t.points.size() && static_cast<double>(t.points[next].time_ns) < column_end) {
      current = &t.points[next++];
      const std::uint64_t total = current->resident_total + current->offloaded;
      if (shown == nullptr || total >= shown_total) {
        shown = current;
        shown_total = total;
      }
    }
    if (shown == nullptr) continue;
    const int x = kLeft + column;
    std::uint64_t stacked = 0;
    for (std::size_t s = 0; s < t.series.size(); ++s) {
      const std::uint64_t bytes = shown->resident[s];
      if (bytes == 0) continue;
      canvas.fill_rect(x, y_of(stacked + bytes), x + 1, y_of(stacked), ChartColours::for_series(t.series[s], s));
      stacked += bytes;
    }
    if (shown->offloaded > 0) {
      const int y0 = y_of(stacked + shown->offloaded);
      const int y1 = y_of(stacked);
      canvas.fill_rect(x, y0, x + 1, y1, ChartColours::offloaded_fill);
      canvas.stripes(x, y0, x + 1, y1, ChartColours::offloaded_stripe, 6);
    }
  }

  // Device memory in use, as sampled: a line two pixels thick.
  for (std::size_t i = 1; i < t.device_used.size(); ++i) {
    const int x0 = x_of(t.device_used[i - 1].time_ns);
    const int x1 = x_of(t.device_used[i].time_ns);
    const int y0 = y_of(t.device_used[i - 1].used_bytes);
    const int y1 = y_of(t.device_used[i].used_bytes);
    canvas.line(x0, y0, x1, y1, ChartColours::device_used);
    canvas.line(x0, y0 - 1, x1, y1 - 1, ChartColours::device_used);
  }
  if (t.device_used.size() == 1) {
    const int y = y_of(t.device_used[0].used_bytes);
    canvas.fill_rect(x_of(t.device_used[0].time_ns) - 2, y - 2, x_of(t.device_used[0].time_ns) + 3, y + 3,
                     ChartColours::device_used);
  }

  // The resident peak, when it falls in the window.
  if (t.peak_resident_bytes > 0 && t.peak_time_ns >= t.begin_ns && t.peak_time_ns <= t.end_ns) {
    // Down to the peak only: a peak may be one pixel column wide, and the line must not hide it.
    const int x = x_of(t.peak_time_ns);
    canvas.line(x, plot_top, x, y_of(t.peak_resident_bytes + t.offloaded_at_peak_bytes) - 3, text, 4);
    const std::string label = "peak " + format_bytes(t.peak_resident_bytes);
    const int label_x = std::min(x + 6, right - Canvas::text_width(label, kScale) - 4);
    canvas.text(label_x, plot_top + 4, label, text, kScale);
  }
  canvas.rect_outline(kLeft - 1, plot_top - 1, right + 1, plot_bottom + 1, text);
  canvas.text_up(6, plot_bottom - plot_height / 2 + Canvas::text_width("device memory", kScale) / 2, "device memory",
                 text, kScale);

  // Lanes: copies in flight and stalls.
  struct Lane {
    const char* label;
    const std::vector<trace::Timeline::Interval>* intervals;
    Rgb colour;
  };
  const Lane lanes[3] = {{"D2H", &t.d2h, ChartColours::d2h}, {"H2D", &t.h2d, ChartColours::h2d}, {"stall", &t.stalls, ChartColours::stall}};
  int lane_top = plot_bottom + kLaneGap + 2;
  for (const Lane& lane : lanes) {
    canvas.fill_rect(kLeft, lane_top, right, lane_top + kLaneHeight, Rgb{246, 246, 246});
    canvas.text(kLeft - 8 - Canvas::text_width(lane.label, kScale), lane_top + 2, lane.label, text, kScale);
    for (const auto& interval : *lane.intervals) {
      const int x0 = x_of(std::max(interval.begin_ns, t.begin_ns));
      const int x1 = std::max(x_of(std::min(interval.end_ns, t.end_ns)), x0 + 1);
      if (interval.finished) {
        canvas.fill_rect(x0, lane_top + 2, x1, lane_top + kLaneHeight - 2, lane.colour);
      } else {
        canvas.stripes(x0, lane_top + 2, x1, lane_top + kLaneHeight - 2, lane.colour, 4);
      }
    }
    lane_top += kLaneHeight + kLaneGap;
  }

  // Time axis.
  const double span_ms = span_ns / 1e6;
  const double x_step = nice_step(span_ms, 10);
  const int axis_y = lane_top + 2;
  for (double ms = 0; ms <= span_ms + 1e-9; ms += x_step) {
    const int x = kLeft + static_cast<int>(std::lround(ms / span_ms * (plot_width - 1)));
    canvas.line(x, axis_y - 4, x, axis_y, text);
    const std::string label = ms_label(ms);
    canvas.text(x - Canvas::text_width(label, kScale) / 2, axis_y + 4, label, text, kScale);
  }
  const std::string axis_label = t.window_iteration ? "ms from the start of the iteration" : "ms from the start of the trace";
  canvas.text(right - Canvas::text_width(axis_label, kScale), axis_y + 24, axis_label, text, kScale);

  // Legend.
  int legend_y = plot_top;
  const int legend_x = right + 24;
  auto entry = [&](const std::string& label, Rgb colour, bool striped) {
    canvas.fill_rect(legend_x, legend_y, legend_x + 18, legend_y + 14, striped ? ChartColours::offloaded_fill : colour);
    if (striped) canvas.stripes(legend_x, legend_y, legend_x + 18, legend_y + 14, colour, 6);
    std::string shown = label;
    const std::size_t room = static_cast<std::size_t>((kLegendWidth - 50) / (6 * kScale));
    if (shown.size() > room) shown = "..." + shown.substr(shown.size() - (room - 3));
    canvas.text(legend_x + 26, legend_y, shown, text, kScale);
    legend_y += 22;
  };
  canvas.text(legend_x, legend_y, "resident, by module:", text, kScale);
  legend_y += 22;
  for (std::size_t s = 0; s < t.series.size(); ++s) entry(t.series[s], ChartColours::for_series(t.series[s], s), false);
  legend_y += 8;
  // What the trace lacks is said in the legend rather than left as an empty lane.
  const bool paging = !t.d2h.empty() || !t.h2d.empty() || t.offloaded_at_peak_bytes > 0;
  entry(paging ? "off the device" : "off the device: none", ChartColours::offloaded_stripe, true);
  canvas.fill_rect(legend_x, legend_y + 6, legend_x + 18, legend_y + 8, ChartColours::device_used);
  canvas.text(legend_x + 26, legend_y, t.device_used.empty() ? "in use: no samples" : "device in use", text, kScale);
  legend_y += 22;
  entry(t.d2h.empty() ? "D2H copies: none" : "offload copy (D2H)", ChartColours::d2h, false);
  entry(t.h2d.empty() ? "H2D copies: none" : "reload copy (H2D)", ChartColours::h2d, false);
  entry(t.stalls.empty() ? "stalls: none" : "stall (job waits)", ChartColours::stall, false);
  // A copy whose END never came (trace::Pairing) is striped in its lane up to where it was seen to stop.
  const auto unfinished = [](const std::vector<trace::Timeline::Interval>& copies) {
    return std::any_of(copies.begin(), copies.end(), [](const auto& copy) { return !copy.finished; });
  };
  if (unfinished(t.d2h) || unfinished(t.h2d)) {
    canvas.stripes(legend_x, legend_y, legend_x + 18, legend_y + 14, ChartColours::text, 4);
    canvas.text(legend_x + 26, legend_y, "copy without END", text, kScale);
  }
}

}  // namespace

Canvas draw_memory_chart(const std::vector<trace::Timeline>& timelines, const ChartOptions& options) {
  const int panels = std::max<int>(static_cast<int>(timelines.size()), 1);
  Canvas canvas(options.width, options.panel_height * panels, ChartColours::background);
  for (std::size_t i = 0; i < timelines.size(); ++i) {
    draw_panel(canvas, timelines[i], static_cast<int>(i) * options.panel_height, options);
  }
  return canvas;
}

}  // namespace actpage::plot

// The picture of `actpage dump --plot`: device memory over one iteration, one panel per trace.
//
// Each panel stacks the bytes resident per module kind (trace/timeline.hpp), draws the bytes off
// the device (pages actpage gave back) striped on top, the device memory in use from the trace's
// samples as a black line, and below the chart one lane each for offload copies (D2H), reload
// copies (H2D) and stalls, with the time axis in milliseconds from the start of the iteration (a
// copy whose END never came is striped, up to where trace::Pairing saw it stop).
// The legend names every series; the title names the trace, its rank and the iteration, and
// states the peak. Colours are fixed (ChartColours) so tests can look for each series.
#pragma once

#include <string>
#include <vector>

#include "plot/canvas.hpp"
#include "trace/timeline.hpp"

namespace actpage::plot {

struct ChartColours {
  static constexpr Rgb background{255, 255, 255};
  static constexpr Rgb text{40, 40, 40};
  static constexpr Rgb grid{225, 225, 225};
  static constexpr Rgb device_used{0, 0, 0};
  static constexpr Rgb offloaded_fill{255, 232, 208};
  static constexpr Rgb offloaded_stripe{230, 120, 30};
  static constexpr Rgb d2h{230, 120, 30};
  static constexpr Rgb h2d{23, 170, 190};
  static constexpr Rgb stall{214, 39, 40};
  static constexpr Rgb other{200, 200, 200};
  // Module kinds, in series order (the series with the most bytes at the peak first).
  static constexpr Rgb series[8] = {{76, 114, 176},  {85, 168, 104}, {129, 114, 179}, {204, 185, 116},
                                    {188, 189, 34},  {140, 140, 140}, {218, 139, 195}, {147, 120, 96}};
  static Rgb for_series(const std::string& name, std::size_t index) {
    return name == "other" ? other : series[index % 8];
  }
};

struct ChartOptions {
  int width = 1400;
  int panel_height = 560;
};

Canvas draw_memory_chart(const std::vector<trace::Timeline>& timelines, const ChartOptions& options = {});

}  // namespace actpage::plot

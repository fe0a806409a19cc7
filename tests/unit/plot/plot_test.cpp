// The drawing layer and the memory chart: checksums against published values, the PNG's chunk
// structure, the canvas primitives, and a chart of a small paging trace that must show each series.
// (tests/unit/plot/check_png.py decodes a chart made by the CLI with Python's zlib: the round trip.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <set>
#include <string>

#include "common/units.hpp"
#include "plot/canvas.hpp"
#include "plot/memory_chart.hpp"
#include "plot/png.hpp"
#include "trace/builder.hpp"
#include "trace/reader.hpp"
#include "trace/timeline.hpp"

namespace actpage::plot {
namespace {

std::uint32_t be32(const std::vector<std::uint8_t>& bytes, std::size_t at) {
  return (std::uint32_t{bytes[at]} << 24) | (std::uint32_t{bytes[at + 1]} << 16) | (std::uint32_t{bytes[at + 2]} << 8) |
         bytes[at + 3];
}

TEST(Png, ChecksumsMatchPublishedValues) {
  const std::string check = "123456789";
  EXPECT_EQ(crc32(reinterpret_cast<const std::uint8_t*>(check.data()), check.size()), 0xcbf43926u);
  const std::string wiki = "Wikipedia";
  EXPECT_EQ(adler32(reinterpret_cast<const std::uint8_t*>(wiki.data()), wiki.size()), 0x11e60398u);
}

TEST(Png, ChunksAreWellFormedWithTheirCrcs) {
  IndexedImage image;
  image.width = 3;
  image.height = 2;
  image.palette = {{0, 0, 0}, {255, 0, 0}};
  image.pixels = {0, 1, 0, 1, 1, 1};
  const std::vector<std::uint8_t> png = encode_png(image);
  const std::uint8_t signature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  ASSERT_GT(png.size(), 8u);
  EXPECT_EQ(std::memcmp(png.data(), signature, 8), 0);
  std::vector<std::string> types;
  std::size_t at = 8;
  while (at + 12 <= png.size()) {
    const std::uint32_t length = be32(png, at);
    const std::string type(reinterpret_cast<const char*>(&png[at + 4]), 4);
    ASSERT_LE(at + 12 + length, png.size()) << type;
    EXPECT_EQ(crc32(&png[at + 4], 4 + length), be32(png, at + 8 + length)) << type;
    if (type == "IHDR") {
      EXPECT_EQ(be32(png, at + 8), 3u);
      EXPECT_EQ(be32(png, at + 12), 2u);
      EXPECT_EQ(png[at + 16], 8);  // bit depth
      EXPECT_EQ(png[at + 17], 3);  // palette
    }
    if (type == "PLTE") {
      EXPECT_EQ(length, 6u);
    }
    types.push_back(type);
    at += 12 + length;
  }
  EXPECT_EQ(at, png.size());
  EXPECT_EQ(types, (std::vector<std::string>{"IHDR", "PLTE", "IDAT", "IEND"}));
}

TEST(Png, LongRunsCompressWell) {
  std::vector<std::uint8_t> flat(100000, 7);
  const auto compressed = zlib_compress(flat, 1, 0);
  EXPECT_LT(compressed.size(), 1000u) << "a run should be a few hundred length-258 matches";
  EXPECT_EQ(compressed[0], 0x78);
  // The trailer is the Adler-32 of the data, big-endian.
  EXPECT_EQ(be32(compressed, compressed.size() - 4), adler32(flat.data(), flat.size()));
}

TEST(Canvas, PrimitivesClipAndReuseColours) {
  Canvas canvas(20, 10, Rgb{255, 255, 255});
  canvas.fill_rect(-5, -5, 5, 5, Rgb{255, 0, 0});
  canvas.fill_rect(18, 8, 40, 40, Rgb{255, 0, 0});
  canvas.line(0, 9, 19, 9, Rgb{0, 0, 255});
  const IndexedImage& image = canvas.image();
  EXPECT_EQ(image.palette.size(), 3u) << "white, red, blue";
  std::size_t red = 0;
  for (const auto p : image.pixels) red += p == 1;
  EXPECT_EQ(red, 25u + 4u - 2u) << "5x5 in the corner, 2x2 at the other, two of them under the blue line";
  EXPECT_EQ(image.pixels[9 * 20 + 0], 2);
  EXPECT_EQ(Canvas::text_width("ab", 2), 22);
  const int end = canvas.text(0, 0, "A", Rgb{0, 0, 0});
  EXPECT_EQ(end, 6);
}

// One iteration: two layers allocate 100 MiB each under their mlp, layer 0's is offloaded and
// reloaded (copies), backward stalls once, memory is sampled.
trace::TraceFile paging_trace() {
  trace::TraceBuilder b;
  b.pid(9).hostname("chart-host");
  constexpr std::uint64_t ms = 1000000;
  b.at(0, 1);
  const std::uint32_t model = b.path("model");
  const std::uint32_t mlp0 = b.path("model/model.layers.0/model.layers.0.mlp");
  const std::uint32_t mlp1 = b.path("model/model.layers.1/model.layers.1.mlp");
  const std::uint32_t attn1 = b.path("model/model.layers.1/model.layers.1.self_attn");
  for (int iteration = 0; iteration < 2; ++iteration) {
    const std::uint64_t t = static_cast<std::uint64_t>(iteration) * 100 * ms;
    b.at(t, 1).range_push(model);
    b.at(t + 1 * ms).alloc(0x1000000, 100 * MiB, mlp0, trace::kAllocOwned | trace::kAllocCandidate);
    b.at(t + 2 * ms).alloc(0x9000000, 50 * MiB, attn1);
    b.at(t + 3 * ms).alloc(0x5000000, 100 * MiB, mlp1);
    b.at(t + 40 * ms).range_pop(model);
    b.at(t + 60 * ms).free(0x5000000).free(0x9000000);
    b.at(t + 80 * ms).free(0x1000000);
    b.at(t + 4 * ms, 2).page(trace::RecordType::offload_begin, 0x1000000, 100 * MiB, mlp0);
    b.at(t + 10 * ms).page(trace::RecordType::offload_end, 0x1000000, 100 * MiB, mlp0);
    b.at(t + 50 * ms).page(trace::RecordType::reload_begin, 0x1000000, 100 * MiB, mlp0);
    b.at(t + 70 * ms).page(trace::RecordType::reload_end, 0x1000000, 100 * MiB, mlp0);
    b.at(t + 72 * ms, 1).stall(5 * ms, mlp0);
    for (std::uint64_t s = 0; s < 100; s += 5) b.at(t + s * ms, 3).mem_sample(GiB - 300 * MiB, GiB);
  }
  auto file = trace::read_trace_bytes(b.bytes(), "chart.trace");
  EXPECT_TRUE(file.ok());
  return std::move(file).value();
}

TEST(Timeline, ResidentBytesLeaveWithOffloadsAndIterationsComeFromTheModelRange) {
  const trace::TraceFile file = paging_trace();
  const trace::Timeline t = trace::build_timeline(file);
  ASSERT_EQ(t.iterations.size(), 2u);
  EXPECT_EQ(t.series, (std::vector<std::string>{"model.layers.*.mlp", "model.layers.*.self_attn"}));
  // The peak: 250 MiB resident at 3 ms of the first iteration (before the offload ends).
  EXPECT_EQ(t.peak_resident_bytes, 250 * MiB);
  EXPECT_EQ(t.peak_time_ns, 3000000u);
  EXPECT_EQ(t.range_at_peak, "model");
  ASSERT_EQ(t.window_iteration, std::optional<std::size_t>(0));
  // Between offload end (10 ms) and reload begin (50 ms): 150 MiB resident, 100 MiB off.
  const auto at = [&](std::uint64_t time_ns) {
    const trace::Timeline::Point* last = nullptr;
    for (const auto& p : t.points) {
      if (p.time_ns <= time_ns) last = &p;
    }
    return last;
  };
  ASSERT_NE(at(20000000), nullptr);
  EXPECT_EQ(at(20000000)->resident_total, 150 * MiB);
  EXPECT_EQ(at(20000000)->offloaded, 100 * MiB);
  EXPECT_EQ(at(55000000)->resident_total, 250 * MiB) << "the reload began: layer 0 is back";
  EXPECT_EQ(at(55000000)->offloaded, 0u);
  EXPECT_EQ(at(65000000)->resident_total, 100 * MiB) << "layer 1 and the attention were freed";
  ASSERT_EQ(t.d2h.size(), 1u);
  EXPECT_EQ(t.d2h[0].end_ns - t.d2h[0].begin_ns, 6000000u);
  ASSERT_EQ(t.stalls.size(), 1u);
  EXPECT_EQ(t.stalls[0].begin_ns, 67000000u);
  EXPECT_EQ(trace::module_kind("model.layers.12.mlp.experts.3"), "model.layers.*.mlp.experts.*");
}

TEST(MemoryChart, DrawsEverySeriesLaneAndTheDeviceLine) {
  const trace::TraceFile file = paging_trace();
  const trace::Timeline t = trace::build_timeline(file);
  ChartOptions options;
  const Canvas canvas = draw_memory_chart({t}, options);
  const IndexedImage& image = canvas.image();
  EXPECT_EQ(image.width, static_cast<std::uint32_t>(options.width));
  EXPECT_EQ(image.height, static_cast<std::uint32_t>(options.panel_height));
  std::vector<std::size_t> counts(image.palette.size(), 0);
  for (const auto p : image.pixels) ++counts[p];
  auto pixels_of = [&](Rgb rgb) {
    for (std::size_t i = 0; i < image.palette.size(); ++i) {
      if (image.palette[i] == rgb) return counts[i];
    }
    return std::size_t{0};
  };
  EXPECT_GT(image.pixels.size() - pixels_of(ChartColours::background), image.pixels.size() / 10) << "blank chart";
  EXPECT_GT(pixels_of(ChartColours::series[0]), 1000u) << "the mlp series";
  EXPECT_GT(pixels_of(ChartColours::series[1]), 1000u) << "the attention series";
  EXPECT_GT(pixels_of(ChartColours::offloaded_fill), 1000u) << "bytes off the device";
  EXPECT_GT(pixels_of(ChartColours::offloaded_stripe), 100u);
  EXPECT_GT(pixels_of(ChartColours::h2d), 200u) << "the reload lane";
  EXPECT_GT(pixels_of(ChartColours::stall), 100u) << "the stall lane";
  EXPECT_GT(pixels_of(ChartColours::device_used), 500u) << "the sampled device memory line";
}

TEST(MemoryChart, SeveralTracesGetOnePanelEach) {
  const trace::TraceFile file = paging_trace();
  const trace::Timeline t = trace::build_timeline(file);
  ChartOptions options;
  const Canvas canvas = draw_memory_chart({t, t, t}, options);
  EXPECT_EQ(canvas.height(), 3 * options.panel_height);
}

}  // namespace
}  // namespace actpage::plot

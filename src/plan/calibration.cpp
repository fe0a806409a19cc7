#include "plan/calibration.hpp"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "common/units.hpp"

namespace actpage::plan {
namespace {

using Clock = std::chrono::steady_clock;

std::uint64_t since(Clock::time_point start) {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - start).count());
}

engine::SizeCurve curve(std::initializer_list<std::pair<std::uint64_t, double>> points) {
  engine::SizeCurve c;
  c.points.assign(points.begin(), points.end());
  return c;
}

nlohmann::json curve_json(const engine::SizeCurve& c) {
  nlohmann::json list = nlohmann::json::array();
  for (const auto& [bytes, value] : c.points) list.push_back({bytes, value});
  return list;
}

Status parse_curve(const nlohmann::json& doc, const char* key, const std::string& path, engine::SizeCurve& out) {
  if (!doc.contains(key)) return Status(ErrorCode::parse_error, path + ": key '" + key + "' is missing");
  const auto& list = doc[key];
  if (!list.is_array() || list.empty()) {
    return Status(ErrorCode::parse_error, path + ": key '" + key + "' must be a non-empty list of [bytes, value]");
  }
  out.points.clear();
  for (const auto& point : list) {
    if (!point.is_array() || point.size() != 2 || !point[0].is_number_unsigned() || !point[1].is_number() ||
        point[1].get<double>() < 0) {
      return Status(ErrorCode::parse_error,
                    path + ": key '" + key + "': each entry must be [bytes, value] with value >= 0, not " + point.dump());
    }
    out.points.emplace_back(point[0].get<std::uint64_t>(), point[1].get<double>());
  }
  std::sort(out.points.begin(), out.points.end());
  return {};
}

// Best-of-n bandwidth of `count` back-to-back copies of `bytes`, one synchronisation each round.
template <class CopyFn>
Result<double> bandwidth(Device& device, StreamHandle stream, EventHandle done, std::uint64_t bytes, int repetitions,
                         CopyFn&& copy) {
  const int count = static_cast<int>(std::clamp<std::uint64_t>((64 * MiB) / std::max<std::uint64_t>(bytes, 1), 1, 32));
  double best = 0;
  for (int round = 0; round <= repetitions; ++round) {  // round 0 warms up
    const auto start = Clock::now();
    for (int i = 0; i < count; ++i) {
      if (Status status = copy(); !status.ok()) return status;
    }
    if (Status status = device.record_event(done, stream); !status.ok()) return status;
    if (Status status = device.synchronize_event(done); !status.ok()) return status;
    const std::uint64_t elapsed = std::max<std::uint64_t>(since(start), 1);
    if (round > 0) best = std::max(best, static_cast<double>(bytes) * count / (static_cast<double>(elapsed) / 1e9));
  }
  return best;
}

}  // namespace

Calibration Calibration::defaults() {
  Calibration c;
  c.device = "defaults (NVIDIA H100 80GB HBM3, PCIe Gen5)";
  c.measured = false;
  c.source = "built-in defaults";
  // FACTS.md, "Copy bandwidth, H100 PCIe Gen5 x16" and "Allocation and mapping costs".
  c.costs.d2h_bytes_per_s = curve({{256 * KiB, 41.3e9}, {2 * MiB, 52.8e9}, {8 * MiB, 54.7e9}, {64 * MiB, 55.1e9}, {512 * MiB, 55.2e9}});
  c.costs.h2d_bytes_per_s = curve({{256 * KiB, 37.6e9}, {2 * MiB, 51.7e9}, {8 * MiB, 54.3e9}, {64 * MiB, 54.8e9}, {512 * MiB, 55.1e9}});
  c.costs.create_ns = curve({{2 * MiB, 10e3}, {64 * MiB, 13e3}, {GiB, 44e3}});
  c.costs.map_ns = curve({{2 * MiB, 29e3}, {64 * MiB, 38e3}, {GiB, 67e3}});
  c.costs.unmap_ns = curve({{2 * MiB, 17e3}, {64 * MiB, 23e3}, {GiB, 34e3}});
  c.costs.release_ns = curve({{2 * MiB, 12e3}, {64 * MiB, 33e3}, {GiB, 353e3}});
  // How long one cuMemUnmap holds the job's thread while its kernels run. In the H100 plan run of
  // 2026-11-23 (docs/tools.md, "Planned vs measured") an unmap took 1.05 ms with kernels running and
  // 0.07-0.1 ms on an idle GPU, and the job's thread paused 0.6 ms per unmap (Llama, 35-39 ms for
  // 61 unmaps a step) and 0.4 ms (Qwen3-MoE): 0.5 ms per unmap.
  c.costs.unmap_job_penalty_ns = 500'000;
  c.pinned_ns_per_gib = 446'000'000;
  c.notes = {"figures of an H100 (FACTS.md, 2026-11-22), not measured on this machine: run `actpage calibrate`",
             "unmap_job_penalty_ns: how long an unmap holds the job's thread, from the H100 plan run's traces (docs/tools.md), not measured here"};
  return c;
}

Result<Calibration> measure(Device& device, const MeasureOptions& options) {
  Calibration c = Calibration::defaults();  // keeps the unmeasured penalty's default
  c.measured = true;
  c.device = options.device_name.empty() ? "device " + std::to_string(device.ordinal()) : options.device_name;
  c.notes = {"unmap_job_penalty_ns is not measured: the default from the H100 plan run's traces (docs/tools.md)"};
  std::vector<std::uint64_t> copy_sizes = options.copy_sizes;
  if (copy_sizes.empty()) copy_sizes = {256 * KiB, 2 * MiB, 8 * MiB, 64 * MiB, 256 * MiB};
  std::vector<std::uint64_t> vmm_sizes = options.vmm_sizes;
  if (vmm_sizes.empty()) vmm_sizes = {2 * MiB, 64 * MiB, GiB};
  const int repetitions = std::max(options.repetitions, 1);
  if (Status status = device.bind_thread(); !status.ok()) return status;

  const std::uint64_t granularity = device.granularity();
  const std::uint64_t biggest = round_up(*std::max_element(copy_sizes.begin(), copy_sizes.end()), granularity);
  const std::uint64_t vmm_biggest = round_up(*std::max_element(vmm_sizes.begin(), vmm_sizes.end()), granularity);

  // Everything taken is given back on every path.
  DevPtr va = 0;
  std::uint64_t va_bytes = std::max(biggest, vmm_biggest);
  PhysicalHandle physical{};
  bool have_physical = false;
  bool mapped = false;
  void* pinned = nullptr;
  StreamHandle stream{};
  bool have_stream = false;
  EventHandle done{};
  bool have_event = false;
  auto cleanup = [&] {
    if (have_event) (void)device.destroy_event(done);
    if (have_stream) (void)device.destroy_stream(stream);
    if (pinned != nullptr) (void)device.free_pinned(pinned);
    if (mapped) (void)device.unmap(va, biggest);
    if (have_physical) (void)device.release_physical(physical);
    if (va != 0) (void)device.unreserve(va, va_bytes);
  };
  auto fail = [&](Status status, const std::string& what) -> Result<Calibration> {
    cleanup();
    return status.context("calibrating: " + what);
  };

  auto reserved = device.reserve(va_bytes);
  if (!reserved.ok()) return fail(reserved.status(), "reserving address space");
  va = *reserved;
  auto handle = device.create_physical(biggest, MemoryLocation::device);
  if (!handle.ok()) return fail(handle.status(), "creating " + format_bytes(biggest) + " of device memory");
  physical = *handle;
  have_physical = true;
  if (Status status = device.map(va, biggest, physical); !status.ok()) return fail(status, "mapping the copy buffer");
  mapped = true;
  auto host = device.alloc_pinned(biggest);
  if (!host.ok()) return fail(host.status(), "allocating pinned host memory");
  pinned = *host;
  auto made_stream = device.create_stream(0);
  if (!made_stream.ok()) return fail(made_stream.status(), "creating a stream");
  stream = *made_stream;
  have_stream = true;
  auto made_event = device.create_event();
  if (!made_event.ok()) return fail(made_event.status(), "creating an event");
  done = *made_event;
  have_event = true;

  c.costs.d2h_bytes_per_s.points.clear();
  c.costs.h2d_bytes_per_s.points.clear();
  for (const std::uint64_t bytes : copy_sizes) {
    auto d2h = bandwidth(device, stream, done, bytes, repetitions, [&] { return device.copy_to_host(pinned, va, bytes, stream); });
    if (!d2h.ok()) return fail(d2h.status(), "timing device-to-host copies of " + format_bytes(bytes));
    auto h2d = bandwidth(device, stream, done, bytes, repetitions, [&] { return device.copy_to_device(va, pinned, bytes, stream); });
    if (!h2d.ok()) return fail(h2d.status(), "timing host-to-device copies of " + format_bytes(bytes));
    c.costs.d2h_bytes_per_s.points.emplace_back(bytes, *d2h);
    c.costs.h2d_bytes_per_s.points.emplace_back(bytes, *h2d);
  }
  (void)device.unmap(va, biggest);
  mapped = false;
  (void)device.release_physical(physical);
  have_physical = false;

  // VMM calls, each the mean of the repetitions, on fresh memory at the reserved address.
  c.costs.create_ns.points.clear();
  c.costs.map_ns.points.clear();
  c.costs.unmap_ns.points.clear();
  c.costs.release_ns.points.clear();
  for (const std::uint64_t size : vmm_sizes) {
    const std::uint64_t bytes = round_up(size, granularity);
    std::uint64_t create = 0, map = 0, unmap = 0, release = 0;
    int done_reps = 0;
    for (int rep = 0; rep < repetitions; ++rep) {
      auto start = Clock::now();
      auto made = device.create_physical(bytes, MemoryLocation::device);
      if (!made.ok()) {
        if (made.status().code() == ErrorCode::out_of_memory) break;  // a smaller device: skip the size
        return fail(made.status(), "timing cuMemCreate of " + format_bytes(bytes));
      }
      create += since(start);
      start = Clock::now();
      Status status = device.map(va, bytes, *made);
      map += since(start);
      if (!status.ok()) {
        (void)device.release_physical(*made);
        return fail(status, "timing cuMemMap of " + format_bytes(bytes));
      }
      start = Clock::now();
      status = device.unmap(va, bytes);
      unmap += since(start);
      start = Clock::now();
      const Status released = device.release_physical(*made);
      release += since(start);
      if (!status.ok()) return fail(status, "timing cuMemUnmap of " + format_bytes(bytes));
      if (!released.ok()) return fail(released, "timing cuMemRelease of " + format_bytes(bytes));
      ++done_reps;
    }
    if (done_reps == 0) {
      c.notes.push_back("VMM calls of " + format_bytes(bytes) + " not timed: out of device memory");
      continue;
    }
    c.costs.create_ns.points.emplace_back(bytes, static_cast<double>(create) / done_reps);
    c.costs.map_ns.points.emplace_back(bytes, static_cast<double>(map) / done_reps);
    c.costs.unmap_ns.points.emplace_back(bytes, static_cast<double>(unmap) / done_reps);
    c.costs.release_ns.points.emplace_back(bytes, static_cast<double>(release) / done_reps);
  }
  if (c.costs.map_ns.points.empty()) return fail(Status(ErrorCode::out_of_memory, "no VMM size fits"), "timing VMM calls");

  // Pinned host memory: slow to get, which is why the host pool allocates ahead.
  (void)device.free_pinned(pinned);
  pinned = nullptr;
  {
    const std::uint64_t bytes = 64 * MiB;
    const auto start = Clock::now();
    auto block = device.alloc_pinned(bytes);
    const std::uint64_t elapsed = since(start);
    if (!block.ok()) return fail(block.status(), "timing pinned host allocation");
    (void)device.free_pinned(*block);
    c.pinned_ns_per_gib = elapsed * (GiB / bytes);
  }
  cleanup();
  return c;
}

std::string to_json(const Calibration& c) {
  nlohmann::ordered_json doc;
  doc["version"] = 1;
  doc["device"] = c.device;
  doc["measured"] = c.measured;
  doc["d2h_bytes_per_s"] = curve_json(c.costs.d2h_bytes_per_s);
  doc["h2d_bytes_per_s"] = curve_json(c.costs.h2d_bytes_per_s);
  doc["create_ns"] = curve_json(c.costs.create_ns);
  doc["map_ns"] = curve_json(c.costs.map_ns);
  doc["unmap_ns"] = curve_json(c.costs.unmap_ns);
  doc["release_ns"] = curve_json(c.costs.release_ns);
  doc["unmap_job_penalty_ns"] = c.costs.unmap_job_penalty_ns;
  doc["pinned_ns_per_gib"] = c.pinned_ns_per_gib;
  doc["notes"] = c.notes;
  return doc.dump(2) + "\n";
}

Result<Calibration> load(const std::string& path) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::io_error, "cannot read calibration file '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  const auto doc = nlohmann::json::parse(text.str(), nullptr, false);
  if (doc.is_discarded() || !doc.is_object()) {
    return Status(ErrorCode::parse_error, path + ": not a JSON object (write it with `actpage calibrate`)");
  }
  if (!doc.contains("version") || doc["version"] != 1) {
    return Status(ErrorCode::parse_error, path + ": key 'version' must be 1");
  }
  Calibration c;
  c.source = path;
  c.device = doc.value("device", std::string("unknown"));
  c.measured = doc.value("measured", false);
  for (const auto& [key, curve_ref] : {std::pair<const char*, engine::SizeCurve*>{"d2h_bytes_per_s", &c.costs.d2h_bytes_per_s},
                                       {"h2d_bytes_per_s", &c.costs.h2d_bytes_per_s},
                                       {"create_ns", &c.costs.create_ns},
                                       {"map_ns", &c.costs.map_ns},
                                       {"unmap_ns", &c.costs.unmap_ns},
                                       {"release_ns", &c.costs.release_ns}}) {
    if (Status status = parse_curve(doc, key, path, *curve_ref); !status.ok()) return status;
  }
  for (const auto& [key, field] : {std::pair<const char*, std::uint64_t*>{"unmap_job_penalty_ns", &c.costs.unmap_job_penalty_ns},
                                   {"pinned_ns_per_gib", &c.pinned_ns_per_gib}}) {
    if (!doc.contains(key)) continue;
    if (!doc[key].is_number_unsigned()) {
      return Status(ErrorCode::parse_error, path + ": key '" + key + "' must be a whole number of nanoseconds");
    }
    *field = doc[key].get<std::uint64_t>();
  }
  if (doc.contains("notes") && doc["notes"].is_array()) {
    for (const auto& note : doc["notes"]) {
      if (note.is_string()) c.notes.push_back(note.get<std::string>());
    }
  }
  return c;
}

Status save(const Calibration& calibration, const std::string& path) {
  std::error_code error;
  const auto parent = std::filesystem::path(path).parent_path();
  if (!parent.empty()) std::filesystem::create_directories(parent, error);
  std::ofstream out(path, std::ios::trunc);
  if (out) out << to_json(calibration);
  if (!out || !out.flush()) return Status(ErrorCode::io_error, "cannot write calibration file '" + path + "'");
  return {};
}

std::string default_path() {
  const char* cache = std::getenv("XDG_CACHE_HOME");
  if (cache != nullptr && *cache != '\0') return std::string(cache) + "/actpage/calibration.json";
  const char* home = std::getenv("HOME");
  return std::string(home != nullptr && *home != '\0' ? home : ".") + "/.cache/actpage/calibration.json";
}

}  // namespace actpage::plan

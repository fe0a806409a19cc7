// Calibration: what copies and VMM calls cost on this machine, measured by `actpage calibrate` and
// read by `actpage replay`/`plan` to price a policy (engine::CostModel).
//
// Contract:
// - defaults() are the H100 PCIe Gen5 figures of /work/shared/FACTS.md (2026-11-22), labelled as
//   defaults (measured == false) so every prediction made with them says so.
// - measure() times the operations on a Device: pinned copies each way at several sizes (the best of
//   a few repetitions, several copies back to back per synchronisation), cuMemCreate/Map/Unmap/
//   Release at several sizes, and pinned host allocation. It gives back every resource it took.
// - The file is JSON: {"version": 1, "device": ..., "measured": bool, "d2h_bytes_per_s": [[bytes,
//   rate], ...], "h2d_bytes_per_s": ..., "create_ns": ..., "map_ns": ..., "unmap_ns": ...,
//   "release_ns": ..., "unmap_job_penalty_ns": n, "pinned_ns_per_gib": n, "notes": [...]}.
//   load() names the file and the key on any error.
// - unmap_job_penalty_ns is not measured: it is how long one cuMemUnmap holds the job's thread
//   while the job's kernels run (the unmap waits for the device; the job's next CUDA call waits for
//   the unmap), which needs a job's kernels in flight. Its default comes from the H100 plan run's
//   traces (docs/tools.md, "Planned vs measured"); a file may set it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actpage/device.hpp"
#include "actpage/status.hpp"
#include "replay/replay.hpp"

namespace actpage::plan {

struct Calibration {
  engine::CostModel costs;
  std::string device;     // "NVIDIA H100 80GB HBM3" or "defaults"
  bool measured = false;  // false: the built-in defaults
  std::uint64_t pinned_ns_per_gib = 0;
  std::string source;     // where it came from: a file path or "built-in defaults"
  std::vector<std::string> notes;

  static Calibration defaults();
};

struct MeasureOptions {
  std::vector<std::uint64_t> copy_sizes;  // empty: 256 KiB, 2, 8, 64, 256 MiB
  std::vector<std::uint64_t> vmm_sizes;   // empty: 2 MiB, 64 MiB, 1 GiB
  int repetitions = 5;
  std::string device_name;
};

Result<Calibration> measure(Device& device, const MeasureOptions& options = {});

std::string to_json(const Calibration& calibration);
Result<Calibration> load(const std::string& path);
Status save(const Calibration& calibration, const std::string& path);
// $XDG_CACHE_HOME/actpage/calibration.json, else $HOME/.cache/actpage/calibration.json.
std::string default_path();

}  // namespace actpage::plan

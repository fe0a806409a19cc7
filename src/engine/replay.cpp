#include "engine/replay.hpp"

#include <algorithm>
#include <condition_variable>
#include <functional>
#include <tuple>
#include <map>
#include <optional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>

#include <atomic>
#include <cmath>
#include <limits>
#include <deque>
#include <queue>
#include <set>

#include "common/units.hpp"
#include "device/sim_device.hpp"
#include "engine/engine.hpp"
#include "policy/module_matcher.hpp"
#include "ranges/registry.hpp"
#include "trace/builder.hpp"
#include "trace/timeline.hpp"

namespace actpage::engine {
namespace {

// Runs tasks on a thread of its own, one at a time, each to completion before run() returns.
class ReplayThread {
 public:
  ReplayThread() : thread_([this] { loop(); }) {}
  ~ReplayThread() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  void run(std::function<void()> task) {
    std::unique_lock<std::mutex> lock(mutex_);
    task_ = std::move(task);
    done_ = false;
    cv_.notify_all();
    cv_.wait(lock, [&] { return done_; });
  }

 private:
  void loop() {
    std::unique_lock<std::mutex> lock(mutex_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || task_; });
      if (stop_) return;
      auto task = std::move(task_);
      task_ = nullptr;
      lock.unlock();
      task();
      lock.lock();
      done_ = true;
      cv_.notify_all();
    }
  }
  std::mutex mutex_;
  std::condition_variable cv_;
  std::function<void()> task_;
  bool done_ = true;
  bool stop_ = false;
  std::thread thread_;
};

// What the engine asked of the device, stamped with the replayed event that caused it and the
// thread that asked (job threads are the replayed trace's; every other thread is a worker of the
// engine, which the model runs one call after another).
struct DeviceOp {
  // map: a mapping, with access (map()) or without (map_without_access()); grant: access granted to
  // mappings made without it. The calibrated map cost includes the access grant, so grant costs nothing
  // more here.
  enum Kind { d2h, h2d, create, map, grant, unmap } kind;
  std::uint64_t event;
  bool job_thread;
  std::size_t thread;  // small index, one per thread that made a call
  DevPtr va;
  std::uint64_t bytes;
};

// A Device that forwards to the simulated one and records the calls the time model prices.
class RecordingDevice final : public Device {
 public:
  explicit RecordingDevice(device::SimDevice& sim) : sim_(sim) {}

  void set_event(std::uint64_t event) { event_.store(event, std::memory_order_relaxed); }
  void add_job_thread(std::thread::id id) {
    std::lock_guard<std::mutex> lock(mutex_);
    job_threads_.insert(id);
  }
  // The calls recorded since the last take, in the order they were made.
  std::vector<DeviceOp> take() {
    std::lock_guard<std::mutex> lock(mutex_);
    return std::exchange(ops_, {});
  }

  int ordinal() const override { return sim_.ordinal(); }
  std::size_t granularity() const override { return sim_.granularity(); }
  Status bind_thread() override { return sim_.bind_thread(); }
  Result<MemInfo> mem_info() override { return sim_.mem_info(); }
  bool supports_host_physical() const override { return sim_.supports_host_physical(); }
  Result<DevPtr> reserve(std::size_t bytes) override { return sim_.reserve(bytes); }
  Status unreserve(DevPtr va, std::size_t bytes) override { return sim_.unreserve(va, bytes); }
  Result<PhysicalHandle> create_physical(std::size_t bytes, MemoryLocation where) override {
    if (where == MemoryLocation::device) record(DeviceOp::create, 0, bytes);
    return sim_.create_physical(bytes, where);
  }
  Status release_physical(PhysicalHandle handle) override { return sim_.release_physical(handle); }
  Status map(DevPtr va, std::size_t bytes, PhysicalHandle handle) override {
    record(DeviceOp::map, va, bytes);
    return sim_.map(va, bytes, handle);
  }
  Status map_without_access(DevPtr va, std::size_t bytes, PhysicalHandle handle) override {
    record(DeviceOp::map, va, bytes);
    return sim_.map_without_access(va, bytes, handle);
  }
  Status grant_access(DevPtr va, std::size_t bytes) override {
    record(DeviceOp::grant, va, bytes);
    return sim_.grant_access(va, bytes);
  }
  Status unmap(DevPtr va, std::size_t bytes) override {
    record(DeviceOp::unmap, va, bytes);
    return sim_.unmap(va, bytes);
  }
  Result<void*> alloc_pinned(std::size_t bytes) override { return sim_.alloc_pinned(bytes); }
  Status free_pinned(void* ptr) override { return sim_.free_pinned(ptr); }
  Result<StreamHandle> create_stream(int priority) override { return sim_.create_stream(priority); }
  Status destroy_stream(StreamHandle stream) override { return sim_.destroy_stream(stream); }
  Result<EventHandle> create_event() override { return sim_.create_event(); }
  Status destroy_event(EventHandle event) override { return sim_.destroy_event(event); }
  Status record_event(EventHandle event, StreamHandle stream) override { return sim_.record_event(event, stream); }
  Status stream_wait_event(StreamHandle stream, EventHandle event) override { return sim_.stream_wait_event(stream, event); }
  Status query_event(EventHandle event) override { return sim_.query_event(event); }
  Status synchronize_event(EventHandle event) override { return sim_.synchronize_event(event); }
  Result<GateHandle> hold_stream(StreamHandle stream) override { return sim_.hold_stream(stream); }
  Status wait_stream_held(GateHandle gate) override { return sim_.wait_stream_held(gate); }
  Status release_stream(GateHandle gate) override { return sim_.release_stream(gate); }
  Result<bool> is_capturing(StreamHandle stream) override { return sim_.is_capturing(stream); }
  Status copy_to_host(void* dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    record(DeviceOp::d2h, src, bytes);
    return sim_.copy_to_host(dst, src, bytes, stream);
  }
  Status copy_to_device(DevPtr dst, const void* src, std::size_t bytes, StreamHandle stream) override {
    record(DeviceOp::h2d, dst, bytes);
    return sim_.copy_to_device(dst, src, bytes, stream);
  }
  Status fill(DevPtr dst, std::uint8_t value, std::size_t bytes, StreamHandle stream) override {
    return sim_.fill(dst, value, bytes, stream);
  }
  Status copy_within_device(DevPtr dst, DevPtr src, std::size_t bytes, StreamHandle stream) override {
    return sim_.copy_within_device(dst, src, bytes, stream);
  }

 private:
  void record(DeviceOp::Kind kind, DevPtr va, std::uint64_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    const auto id = std::this_thread::get_id();
    const std::size_t thread = thread_index_.try_emplace(id, thread_index_.size()).first->second;
    ops_.push_back({kind, event_.load(std::memory_order_relaxed), job_threads_.count(id) != 0, thread, va, bytes});
  }
  device::SimDevice& sim_;
  std::atomic<std::uint64_t> event_{0};
  std::mutex mutex_;
  std::set<std::thread::id> job_threads_;
  std::map<std::thread::id, std::size_t> thread_index_;
  std::vector<DeviceOp> ops_;
};

// The time model of replay.hpp, fed one replayed event at a time. Two clocks run behind the
// trace's: the job's threads are `cpu_delay_` late, its GPU work `gpu_delay_` late; worker threads
// and copy engines keep their own times on the predicted timeline.
class TimeModel {
 public:
  TimeModel(const CostModel& costs, std::size_t granularity, const GpuBacklog& backlog, std::size_t max_inflight)
      : costs_(costs), granularity_(granularity), backlog_(backlog), max_inflight_(std::max<std::size_t>(1, max_inflight)) {}

  struct Copy {
    std::uint64_t begin_ns;  // on the predicted timeline
    std::uint64_t end_ns;
    DevPtr va;
    std::uint64_t bytes;
    std::uint64_t traced_ptr = 0;  // the traced allocation at va when the copy was issued
    std::uint32_t path_id = 0;
    bool cancelled = false;        // an offload overtaken before it was issued: it never ran
    bool pages_kept = false;       // an offload overtaken by its reload: its pages never left
    std::uint64_t given_back_ns = 0;  // an offload's unmap ended (0: not placed)
  };
  // Names a copy's allocation as the trace knows it (for the predicted trace).
  std::function<std::pair<std::uint64_t, std::uint32_t>(DevPtr)> tag_of;
  // Whether an address is where an allocation served by the engine starts.
  std::function<bool(DevPtr)> starts_allocation;

  // The event at traced time `time_ns` happens: the job's thread resumes from a synchronisation or
  // is held by unmaps that began before it, makes its own device calls, the workers make theirs;
  // then, for a backward marker of `marker_module`, the wait for the reloads it needs.
  // `names_of(va)` gives the module names whose backward needs the allocation at va; `freed_va` is
  // the engine's range the job freed at this event, if any.
  template <class NamesOf>
  void event(std::uint64_t time_ns, const std::vector<DeviceOp>& ops, const std::string* marker_module,
             const NamesOf& names_of, std::optional<DevPtr> freed_va) {
    if (!started_) {
      first_ns_ = time_ns;
      started_ = true;
    }
    last_ns_ = time_ns;
    resume_after_sync(time_ns);
    std::uint64_t now = apply_holds(time_ns + cpu_delay_);
    issue_reloads(now);
    const std::uint64_t backlog = backlog_.at(time_ns);
    // The GPU cannot run work before the job's thread launched it: a thread delay beyond the
    // backlog delays the GPU too.
    gpu_delay_ = std::max(gpu_delay_, cpu_delay_ > backlog ? cpu_delay_ - backlog : 0);
    // When the GPU reaches the work launched now (a module's end, a free).
    auto gpu_at = [&] { return time_ns + backlog + gpu_delay_; };
    if (freed_va) gpu_free_at_[*freed_va] = gpu_at();

    // The job's own calls (range-cache misses) take their time on its thread.
    for (const DeviceOp& op : ops) {
      if (!op.job_thread || op.kind == DeviceOp::grant) continue;  // priced with its map
      const std::uint64_t cost = call_ns(op);
      ++timing.job_vmm_calls;
      timing.job_vmm_ns += cost;
      if (op.kind == DeviceOp::unmap) ++timing.unmaps;
      cpu_delay_ += cost;
      now += cost;
    }
    // Each worker's calls, in the order it made them.
    std::vector<std::size_t> order;
    for (const DeviceOp& op : ops) {
      if (!op.job_thread && std::find(order.begin(), order.end(), op.thread) == order.end()) order.push_back(op.thread);
    }
    for (std::size_t thread : order) {
      Worker& worker = workers_[thread];
      for (const DeviceOp& op : ops) {
        if (op.job_thread || op.thread != thread) continue;
        switch (op.kind) {
          case DeviceOp::d2h:
            offload(op, now, gpu_at());
            break;
          case DeviceOp::unmap:
            if (!offload_unmap(op, worker)) worker.prep.push_back(op);
            break;
          case DeviceOp::create:
          case DeviceOp::map:
          case DeviceOp::grant:
            worker.prep.push_back(op);
            break;
          case DeviceOp::h2d:
            request_reload(op, worker, thread, now, names_of(op.va), marker_module);
            break;
        }
      }
      // Calls not followed by a copy (pages recycled or trimmed): worker time all the same.
      worker.free_ns = prepare(worker, std::max(now, worker.free_ns));
    }

    if (marker_module != nullptr) {
      issue_reloads(now, marker_module);
      std::uint64_t issued = now;  // the engine's job thread waits until each needed reload is issued
      std::uint64_t done = 0;      // and makes the job's stream wait for the copies
      std::size_t latest = 0;
      std::vector<Awaited> still;
      for (Awaited& a : awaiting_) {
        if (std::find(a.names.begin(), a.names.end(), *marker_module) != a.names.end()) {
          if (a.issue_ns > issued) {
            issued = a.issue_ns;
            latest = a.copy;
          }
          done = std::max(done, a.end_ns);
        } else {
          still.push_back(std::move(a));
        }
      }
      awaiting_ = std::move(still);
      if (issued > now) {
        ++timing.stalls;
        timing.stall_ns += issued - now;
        stalls.push_back({now, issued, h2d[latest].va, h2d[latest].bytes, h2d[latest].traced_ptr, h2d[latest].path_id});
        note_wait(now, issued);
        cpu_delay_ += issued - now;
        now = issued;
        gpu_delay_ = std::max(gpu_delay_, cpu_delay_ > backlog ? cpu_delay_ - backlog : 0);
      }
      if (done > gpu_at()) {
        ++timing.gpu_waits;
        const std::uint64_t waited = done - gpu_at();
        timing.gpu_wait_ns += waited;
        gpu_delay_ += waited;
      }
    }
    now_ = now;
  }

  // Bytes the instant replay counts as gone that are still on the device now: offloads whose pages
  // are not given back yet (the instant replay takes them as gone from the copy on; one overtaken
  // by its reload is back in its count from the reload on).
  std::uint64_t pending_bytes() {
    std::uint64_t bytes = 0;
    for (auto it = pending_.begin(); it != pending_.end();) {
      const Offload& o = offloads_[*it];
      if (o.unmapped && o.unmap_end_ns <= now_) {
        it = pending_.erase(it);
        continue;
      }
      if (o.unmapped || d2h[o.copy].end_ns + costs_.unmap_job_penalty_ns > now_) bytes += o.bytes;
      ++it;
    }
    return bytes;
  }
  std::uint64_t now(std::uint64_t time_ns) const { return time_ns + cpu_delay_; }

  ReplayTiming timing;
  std::vector<Copy> d2h;
  std::vector<Copy> h2d;
  std::vector<Copy> stalls;

  void finish() {
    issue_reloads(std::numeric_limits<std::uint64_t>::max());
    // The job ends when its GPU work is done.
    const std::uint64_t delay = std::max(cpu_delay_, gpu_delay_);
    timing.traced_ns = started_ ? last_ns_ - first_ns_ : 0;
    timing.predicted_ns = timing.traced_ns + delay;
    timing.added_ns = delay;
    for (const Copy& copy : d2h) {
      if (copy.cancelled) continue;
      ++timing.d2h_copies;
      timing.d2h_busy_ns += copy.end_ns - copy.begin_ns;
    }
  }

 private:
  struct Awaited {
    std::uint64_t issue_ns;
    std::uint64_t end_ns;
    std::vector<std::string> names;
    std::size_t copy;
  };
  // One offload copy and what became of its pages.
  struct Offload {
    std::size_t copy = 0;           // into d2h
    std::uint64_t issue_ns = 0;     // the engine issued the copy (at most max_inflight in flight)
    std::uint64_t unmap_begin_ns = 0;
    std::uint64_t unmap_end_ns = 0;
    bool unmapped = false;          // its unmap is placed
    bool cancelled = false;         // its reload came first: the pages never left
    std::uint64_t bytes = 0;        // whole pages
  };
  // An unmap holding the job's thread from begin to end (see replay.hpp).
  struct Hold {
    std::uint64_t begin_ns;
    std::uint64_t end_ns;
    std::size_t offload;  // the offload it gives back (void if that was cancelled); npos: none
    bool operator>(const Hold& other) const { return begin_ns > other.begin_ns; }
  };
  struct Worker {
    std::uint64_t free_ns = 0;
    std::vector<DeviceOp> prep;  // maps, creates and unmaps waiting for the copy they prepare
  };
  struct Reload {
    DevPtr va;
    std::uint64_t bytes;
    std::vector<DeviceOp> prep;
    std::uint64_t requested_ns;
    std::uint64_t given_back_ns;  // its offload's pages were given back (0: not offloaded by the model)
    std::vector<std::string> names;
    std::size_t thread;            // the worker that reloads it
    std::uint64_t urgent_at = std::numeric_limits<std::uint64_t>::max();  // asked for by a marker then
  };
  static constexpr std::size_t npos = static_cast<std::size_t>(-1);

  std::uint64_t call_ns(const DeviceOp& op) const {
    switch (op.kind) {
      case DeviceOp::create: return static_cast<std::uint64_t>(costs_.create_ns.at(op.bytes));
      case DeviceOp::map: return static_cast<std::uint64_t>(costs_.map_ns.at(op.bytes));
      case DeviceOp::unmap: return unmap_ns(op.bytes);
      default: return 0;
    }
  }
  // An unmap returns after its calibrated time, or after the hold it imposes, whichever is longer.
  std::uint64_t unmap_ns(std::uint64_t bytes) const {
    return std::max(static_cast<std::uint64_t>(costs_.unmap_ns.at(bytes)), costs_.unmap_job_penalty_ns);
  }

  // The engine issues an offload copy: it runs on the D2H engine once the GPU has run the module
  // that made the data, in issue order.
  void offload(const DeviceOp& op, std::uint64_t now, std::uint64_t gpu_at) {
    // The engine copies an allocation in chunks, one after another on the D2H engine: a copy that
    // does not start at a served allocation continues the offload whose last chunk ended there.
    if (auto next = chunk_next_.find(op.va);
        next != chunk_next_.end() && (!starts_allocation || !starts_allocation(op.va))) {
      const std::size_t index = next->second;
      chunk_next_.erase(next);
      Offload& o = offloads_[index];
      Copy& copy = d2h[o.copy];
      if (!copy.cancelled) {
        copy.end_ns = std::max(copy.end_ns, d2h_free_) + costs_.d2h_ns(op.bytes);
        d2h_free_ = copy.end_ns;
      }
      copy.bytes += op.bytes;
      o.bytes = round_up(copy.bytes, granularity_);
      chunk_next_[op.va + op.bytes] = index;
      return;
    }
    std::uint64_t issue = now;
    if (live_d2h_.size() >= max_inflight_) issue = std::max(issue, d2h[live_d2h_[live_d2h_.size() - max_inflight_]].end_ns);
    const std::uint64_t start = std::max({issue, gpu_at, d2h_free_});
    const std::uint64_t end = start + costs_.d2h_ns(op.bytes);
    d2h_free_ = end;
    live_d2h_.push_back(d2h.size());
    d2h.push_back({start, end, op.va, op.bytes});
    if (tag_of) std::tie(d2h.back().traced_ptr, d2h.back().path_id) = tag_of(op.va);
    Offload o;
    o.copy = d2h.size() - 1;
    o.issue_ns = issue;
    o.bytes = round_up(op.bytes, granularity_);
    offload_at_[op.va] = offloads_.size();
    chunk_next_[op.va + op.bytes] = offloads_.size();
    pending_.insert(offloads_.size());
    offloads_.push_back(o);
  }

  // The offload worker gives an offload's pages back when its copy ended, one unmap after another.
  bool offload_unmap(const DeviceOp& op, Worker& worker) {
    auto it = offload_at_.find(op.va);
    if (it == offload_at_.end()) return false;
    Offload& o = offloads_[it->second];
    if (o.unmapped) return false;
    const std::uint64_t begin = std::max(d2h[o.copy].end_ns, worker.free_ns);
    o.unmapped = true;
    o.unmap_begin_ns = begin;
    o.unmap_end_ns = begin + unmap_ns(op.bytes);
    d2h[o.copy].given_back_ns = o.unmap_end_ns;
    worker.free_ns = o.unmap_end_ns;
    ++timing.unmaps;
    hold(begin, it->second);
    return true;
  }

  // A reload asked for: unless the engine keeps the pages (the offload not issued, still copying or
  // not given back yet), it joins the reload worker's queue, at the front when the marker of this
  // event needs it (the engine's urgent reloads), with the calls that prepare its pages.
  void request_reload(const DeviceOp& op, Worker& worker, std::size_t thread, std::uint64_t now,
                      const std::vector<std::string>& names, const std::string* marker_module) {
    auto it = offload_at_.find(op.va);
    std::uint64_t given_back = 0;
    if (it != offload_at_.end()) {
      Offload& o = offloads_[it->second];
      const bool kept = o.issue_ns > now || d2h[o.copy].end_ns > now || !o.unmapped || o.unmap_begin_ns > now;
      pending_.erase(it->second);
      offload_at_.erase(it);
      if (kept) {
        o.cancelled = true;
        d2h[o.copy].pages_kept = true;
        ++timing.offloads_cancelled;
        if (o.issue_ns > now) cancel_copy(o.copy);
        worker.prep.clear();  // the pages the worker would have mapped were not needed
        return;
      }
      given_back = o.unmap_end_ns;
    }
    Reload r{op.va, op.bytes, std::exchange(worker.prep, {}), now, given_back, names, thread};
    const bool urgent =
        marker_module != nullptr && std::find(names.begin(), names.end(), *marker_module) != names.end();
    if (urgent) {
      // Behind the urgent ones already queued at this event, before every prefetch.
      auto at = reload_queue_.begin();
      while (at != reload_queue_.end() && at->urgent_at == now) ++at;
      r.urgent_at = now;
      reload_queue_.insert(at, std::move(r));
    } else {
      reload_queue_.push_back(std::move(r));
    }
  }

  // The reload worker takes the queue's front when a copy slot is free (at most max_inflight in
  // flight), prepares its pages and issues the copy; the H2D engine runs copies in issue order.
  // Issues what starts by `until`; with `names`, until no queued reload is for those modules.
  void issue_reloads(std::uint64_t until, const std::string* needed_by = nullptr) {
    auto needed = [&] {
      return needed_by != nullptr && std::any_of(reload_queue_.begin(), reload_queue_.end(), [&](const Reload& r) {
               return std::find(r.names.begin(), r.names.end(), *needed_by) != r.names.end();
             });
    };
    while (!reload_queue_.empty()) {
      Reload& r = reload_queue_.front();
      Worker& worker = workers_[r.thread];
      std::uint64_t at = std::max(worker.free_ns, r.requested_ns);
      if (issued_h2d_.size() >= max_inflight_) at = std::max(at, h2d[issued_h2d_[issued_h2d_.size() - max_inflight_]].end_ns);
      if (at > until && !needed()) return;
      worker.prep = std::move(r.prep);
      const std::uint64_t issue = prepare(worker, at);
      worker.free_ns = issue;
      const std::uint64_t start = std::max({issue, h2d_free_, r.given_back_ns});
      if (r.given_back_ns > issue) ++timing.late_offloads;
      const std::uint64_t end = start + costs_.h2d_ns(r.bytes);
      h2d_free_ = end;
      ++timing.h2d_copies;
      timing.h2d_busy_ns += end - start;
      issued_h2d_.push_back(h2d.size());
      h2d.push_back({start, end, r.va, r.bytes});
      if (tag_of) std::tie(h2d.back().traced_ptr, h2d.back().path_id) = tag_of(r.va);
      awaiting_.push_back({issue, end, std::move(r.names), h2d.size() - 1});
      reload_queue_.pop_front();
    }
  }

  // An offload copy never issued does not run: the D2H engine is free again from the end of the
  // copy before it (when it was the last queued; otherwise the model keeps the slot, a small error).
  void cancel_copy(std::size_t copy) {
    d2h[copy].cancelled = true;
    if (!live_d2h_.empty() && live_d2h_.back() == copy) {
      live_d2h_.pop_back();
      d2h_free_ = live_d2h_.empty() ? 0 : d2h[live_d2h_.back()].end_ns;
    }
  }

  // The worker's pending calls from `at`: an unmap of pages the job freed waits until the GPU has
  // passed that free (the engine synchronises with the free's stream point) and holds the job's
  // thread; creates and maps take their calibrated time. Returns when the worker is done.
  std::uint64_t prepare(Worker& worker, std::uint64_t at) {
    for (const DeviceOp& op : worker.prep) {
      if (op.kind == DeviceOp::unmap) {
        if (auto freed = gpu_free_at_.find(op.va); freed != gpu_free_at_.end()) at = std::max(at, freed->second);
        ++timing.unmaps;
        hold(at, npos);
      }
      at += call_ns(op);
    }
    worker.prep.clear();
    return at;
  }

  void hold(std::uint64_t begin, std::size_t offload) {
    if (costs_.unmap_job_penalty_ns == 0) return;
    holds_.push({begin, begin + costs_.unmap_job_penalty_ns, offload});
  }

  // Holds that began by `now` delay the job's thread, except while it was waiting anyway.
  std::uint64_t apply_holds(std::uint64_t now) {
    while (!holds_.empty() && holds_.top().begin_ns <= now) {
      const Hold h = holds_.top();
      holds_.pop();
      if (h.offload != npos && offloads_[h.offload].cancelled) continue;
      std::uint64_t held = h.end_ns - h.begin_ns;
      for (const auto& [from, to] : waits_) {
        const std::uint64_t a = std::max(from, h.begin_ns);
        const std::uint64_t b = std::min(to, h.end_ns);
        if (b > a) held -= std::min(held, b - a);
      }
      timing.unmap_penalty_ns += held;
      cpu_delay_ += held;
      now += held;
    }
    return now;
  }

  void note_wait(std::uint64_t from, std::uint64_t to) {
    waits_.emplace_back(from, to);
    if (waits_.size() > 8) waits_.pop_front();
  }

  // The job's threads waited for the GPU at the end of a step (GpuBacklog): they resume when both
  // they reached the wait and the GPU finished, which with the GPU late is later than traced.
  void resume_after_sync(std::uint64_t time_ns) {
    const auto& windows = backlog_.windows();
    while (next_window_ < windows.size() && windows[next_window_].sync_end_ns <= time_ns) {
      const GpuBacklog::Window& w = windows[next_window_++];
      if (w.sync_begin_ns < first_ns_ || w.sync_end_ns <= w.sync_begin_ns) continue;
      const std::uint64_t waited = w.sync_end_ns - w.sync_begin_ns;
      const std::uint64_t resumed = std::max(cpu_delay_ > waited ? cpu_delay_ - waited : 0, gpu_delay_);
      note_wait(w.sync_begin_ns + cpu_delay_, w.sync_end_ns + resumed);
      cpu_delay_ = resumed;
      gpu_delay_ = resumed;
    }
  }

  const CostModel& costs_;
  std::size_t granularity_;
  const GpuBacklog& backlog_;
  std::size_t max_inflight_;
  bool started_ = false;
  std::uint64_t first_ns_ = 0;
  std::uint64_t last_ns_ = 0;
  std::uint64_t now_ = 0;         // the job's thread after the last event, predicted timeline
  std::uint64_t cpu_delay_ = 0;
  std::uint64_t gpu_delay_ = 0;
  std::size_t next_window_ = 0;
  std::uint64_t d2h_free_ = 0;
  std::uint64_t h2d_free_ = 0;
  std::vector<std::size_t> live_d2h_;  // offload copies not cancelled, in issue order
  std::vector<std::size_t> issued_h2d_;  // reload copies in issue order
  std::deque<Reload> reload_queue_;      // asked for, not issued yet
  std::vector<Offload> offloads_;
  std::unordered_map<DevPtr, std::size_t> offload_at_;  // va -> its offload not yet reloaded
  std::unordered_map<DevPtr, std::size_t> chunk_next_;  // where an offload's next chunk would start
  std::set<std::size_t> pending_;                        // offloads whose pages may still be there
  std::unordered_map<DevPtr, std::uint64_t> gpu_free_at_;  // range -> when the GPU passes its last free
  std::map<std::size_t, Worker> workers_;
  std::priority_queue<Hold, std::vector<Hold>, std::greater<>> holds_;
  std::deque<std::pair<std::uint64_t, std::uint64_t>> waits_;  // recent intervals the job's thread waited
  std::vector<Awaited> awaiting_;
};

struct Event {
  std::uint64_t time_ns;
  std::uint64_t index;
  std::uint32_t tid;
  enum Kind { alloc, free, push, pop } kind;
  std::size_t position;  // into the trace's list of that kind
};

}  // namespace

double SizeCurve::at(std::uint64_t bytes) const {
  if (points.empty()) return 0;
  if (bytes <= points.front().first) return points.front().second;
  if (bytes >= points.back().first) return points.back().second;
  for (std::size_t i = 1; i < points.size(); ++i) {
    if (bytes > points[i].first) continue;
    const double x0 = std::log(static_cast<double>(points[i - 1].first));
    const double x1 = std::log(static_cast<double>(points[i].first));
    const double f = x1 > x0 ? (std::log(static_cast<double>(bytes)) - x0) / (x1 - x0) : 0;
    return points[i - 1].second + f * (points[i].second - points[i - 1].second);
  }
  return points.back().second;
}

std::uint64_t CostModel::d2h_ns(std::uint64_t bytes) const {
  const double rate = d2h_bytes_per_s.at(bytes);
  return rate > 0 ? static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes) / rate * 1e9)) : 0;
}

std::uint64_t CostModel::h2d_ns(std::uint64_t bytes) const {
  const double rate = h2d_bytes_per_s.at(bytes);
  return rate > 0 ? static_cast<std::uint64_t>(std::llround(static_cast<double>(bytes) / rate * 1e9)) : 0;
}

GpuBacklog::GpuBacklog(std::vector<Window> windows) : windows_(std::move(windows)) {}

GpuBacklog GpuBacklog::from_trace(const trace::TraceFile& trace, const std::vector<trace::Timeline::Iteration>& iterations) {
  // The job's threads' records in time order, and when each backward marker was pushed.
  std::vector<std::uint64_t> times;
  std::vector<std::uint64_t> markers;
  times.reserve(trace.allocs.size() + trace.frees.size() + trace.ranges.size());
  for (const auto& a : trace.allocs) times.push_back(a.time_ns);
  for (const auto& f : trace.frees) times.push_back(f.time_ns);
  for (const auto& r : trace.ranges) {
    times.push_back(r.time_ns);
    if (r.type != trace::RecordType::range_push) continue;
    if (const trace::ResolvedPath* path = trace.path(r.data.path_id); path != nullptr && path->backward) {
      markers.push_back(r.time_ns);
    }
  }
  std::sort(times.begin(), times.end());
  std::sort(markers.begin(), markers.end());
  std::vector<Window> windows;
  // Whole iterations only: the last one ends with the trace, not necessarily with a wait.
  for (std::size_t i = 0; i + 1 < iterations.size(); ++i) {
    const auto& iteration = iterations[i];
    // The wait comes after the step's last backward marker (when there is one).
    std::uint64_t from = iteration.begin_ns;
    auto marker = std::lower_bound(markers.begin(), markers.end(), iteration.end_ns);
    if (marker != markers.begin() && *std::prev(marker) >= iteration.begin_ns) from = *std::prev(marker);
    Window w{iteration.begin_ns, from, from};
    auto it = std::lower_bound(times.begin(), times.end(), from);
    std::uint64_t previous = from;
    for (; it != times.end() && *it <= iteration.end_ns; ++it) {
      if (*it - previous > w.sync_end_ns - w.sync_begin_ns) {
        w.sync_begin_ns = previous;
        w.sync_end_ns = *it;
      }
      previous = *it;
    }
    if (w.sync_end_ns > w.sync_begin_ns) windows.push_back(w);
  }
  return GpuBacklog(std::move(windows));
}

std::uint64_t GpuBacklog::at(std::uint64_t time_ns) const {
  auto it = std::upper_bound(windows_.begin(), windows_.end(), time_ns,
                             [](std::uint64_t t, const Window& w) { return t < w.begin_ns; });
  if (it == windows_.begin()) return 0;
  const Window& w = *std::prev(it);
  const std::uint64_t wait = w.sync_end_ns - w.sync_begin_ns;
  if (time_ns >= w.sync_end_ns) return 0;
  if (time_ns >= w.sync_begin_ns) return w.sync_end_ns - time_ns;
  const double ramp = static_cast<double>(time_ns - w.begin_ns) / static_cast<double>(w.sync_begin_ns - w.begin_ns);
  return static_cast<std::uint64_t>(std::llround(ramp * static_cast<double>(wait)));
}

std::uint64_t GpuBacklog::median_sync_wait_ns() const {
  if (windows_.empty()) return 0;
  std::vector<std::uint64_t> waits;
  for (const Window& w : windows_) waits.push_back(w.sync_end_ns - w.sync_begin_ns);
  std::sort(waits.begin(), waits.end());
  return waits[(waits.size() - 1) / 2];
}

Result<ReplayResult> replay_trace(const trace::TraceFile& trace, const Options& options,
                                  const ReplayOptions& replay_options) {
  ReplayResult result;
  std::vector<Event> events;
  events.reserve(trace.allocs.size() + trace.frees.size() + trace.ranges.size());
  for (std::size_t i = 0; i < trace.allocs.size(); ++i) {
    const auto& a = trace.allocs[i];
    if ((a.data.flags & trace::kAllocFailed) != 0 || a.data.ptr == 0) continue;
    events.push_back({a.time_ns, a.index, a.tid, Event::alloc, i});
  }
  for (std::size_t i = 0; i < trace.frees.size(); ++i) {
    events.push_back({trace.frees[i].time_ns, trace.frees[i].index, trace.frees[i].tid, Event::free, i});
  }
  for (std::size_t i = 0; i < trace.ranges.size(); ++i) {
    const auto& r = trace.ranges[i];
    events.push_back({r.time_ns, r.index, r.tid, r.type == trace::RecordType::range_push ? Event::push : Event::pop, i});
  }
  std::stable_sort(events.begin(), events.end(), [](const Event& x, const Event& y) {
    return x.time_ns != y.time_ns ? x.time_ns < y.time_ns : x.index < y.index;
  });

  device::SimDeviceConfig config;
  config.capacity_bytes = 1ull << 50;  // the question is how much is used, not whether it fits
  config.data_less = true;             // sizes and mappings only: no host memory behind them
  device::SimDevice sim(config);
  RecordingDevice device(sim);
  Options replay_options_copy = options;
  // Ranges prefilled depend on when the VMM worker runs against the job's allocations, which the
  // simulated device does not reproduce: the replay leaves them out, so its job-thread maps are
  // what the job would make without them (an upper bound) and its peak does not move with them.
  replay_options_copy.vmm_prefill_cache = false;
  // The replay's job thread replays the trace's own timing; a backlog wait there would only depend
  // on the simulated streams' speed: offload_backlog_bytes is not modelled (its time cost is not
  // predicted, and its saving shows as the copies the trace's timing allows).
  replay_options_copy.offload_backlog_bytes = 0;
  replay_options_copy.offload_drain_at_layers_end = false;
  replay_options_copy.offload_drain_at_backward_start = false;
  Engine engine(replay_options_copy, [&](int) -> Result<Device*> { return static_cast<Device*>(&device); });
  engine.set_wait_for_host_memory(true);
  // The engine's workers run one at a time in a fixed order: otherwise which of them reaches the
  // lock first decides calls the model prices (which windows one unmap gives back, whether a
  // cached range is trimmed before a reload takes it...), and the prediction varies run to run.
  engine.set_serialized(true);
  ranges::set_listener(&engine);

  // Which module names' backward markers need an allocation back: the range that selected it and
  // that range's parent (the engine names its groups so), found from the traced path.
  const policy::ModuleMatcher matcher(options);
  std::unordered_map<std::uint32_t, std::vector<std::string>> names_by_path;
  auto group_names = [&](std::uint32_t path_id) -> const std::vector<std::string>& {
    auto [it, inserted] = names_by_path.try_emplace(path_id);
    if (!inserted) return it->second;
    for (std::uint32_t node = path_id; node != 0;) {
      auto found = trace.path_nodes.find(node);
      if (found == trace.path_nodes.end()) break;
      const std::string name(trace.name(found->second.name_id));
      if (auto rule = matcher.match(name)) {
        if (rule->offload) {
          it->second.push_back(name);
          if (auto parent = trace.path_nodes.find(found->second.parent); parent != trace.path_nodes.end()) {
            it->second.emplace_back(trace.name(parent->second.name_id));
          }
        }
        break;
      }
      node = found->second.parent;
    }
    return it->second;
  };
  std::unordered_map<DevPtr, std::uint32_t> path_of_va;  // served allocations: their traced path
  std::unordered_map<DevPtr, std::uint64_t> traced_ptr_of_va;  // and their traced pointer
  static const std::vector<std::string> kNoNames;
  auto names_of = [&](DevPtr va) -> const std::vector<std::string>& {
    auto it = path_of_va.find(va);
    return it == path_of_va.end() ? kNoNames : group_names(it->second);
  };

  std::optional<TimeModel> model;
  trace::TimelineOptions whole;
  whole.whole_trace = true;
  const auto iterations = trace::build_timeline(trace, whole).iterations;
  const GpuBacklog backlog = replay_options.costs != nullptr ? GpuBacklog::from_trace(trace, iterations) : GpuBacklog{};
  if (replay_options.costs != nullptr) {
    model.emplace(*replay_options.costs, sim.granularity(), backlog, static_cast<std::size_t>(options.max_inflight_copies));
    model->tag_of = [&](DevPtr va) -> std::pair<std::uint64_t, std::uint32_t> {
      auto ptr = traced_ptr_of_va.find(va);
      auto path = path_of_va.find(va);
      return {ptr == traced_ptr_of_va.end() ? va : ptr->second, path == path_of_va.end() ? 0 : path->second};
    };
    model->starts_allocation = [&](DevPtr va) { return traced_ptr_of_va.count(va) != 0; };
  }
  std::vector<std::uint64_t> shifted(events.size(), 0);  // each event's time on the predicted timeline

  std::map<std::uint32_t, std::unique_ptr<ReplayThread>> threads;
  std::unordered_map<std::uint64_t, StreamHandle> streams;
  struct Live {
    DevPtr va;
    std::uint64_t bytes;
    bool owned;
    StreamHandle stream;
  };
  std::unordered_map<std::uint64_t, Live> live;  // traced pointer -> what replay made of it
  std::uint64_t traced_live = 0;
  std::uint64_t passthrough_live = 0;
  auto& registry = ranges::Registry::instance();

  auto stream_for = [&](std::uint64_t traced) {
    auto it = streams.find(traced);
    if (it != streams.end()) return it->second;
    StreamHandle stream = traced == 0 ? StreamHandle{0} : *sim.create_stream(0);
    streams.emplace(traced, stream);
    return stream;
  };
  auto observe = [&](std::uint64_t time_ns) {
    if (traced_live > result.baseline_peak_bytes) {
      result.baseline_peak_bytes = traced_live;
      result.baseline_peak_time_ns = time_ns;
    }
    const std::uint64_t in_use = passthrough_live + sim.stats().device_resident_bytes;
    if (in_use > result.predicted_peak_bytes) {
      result.predicted_peak_bytes = in_use;
      result.predicted_peak_time_ns = time_ns;
      result.offloaded_at_peak_bytes = engine.stats().offloaded_bytes_now;
    }
    if (model) {
      const std::uint64_t timed = in_use + model->pending_bytes();
      if (timed > result.timing.timed_peak_bytes) {
        result.timing.timed_peak_bytes = timed;
        result.timing.timed_peak_time_ns = model->now(time_ns);
      }
    }
  };

  for (std::size_t e = 0; e < events.size(); ++e) {
    const Event& event = events[e];
    auto& thread = threads[event.tid];
    if (!thread) {
      thread = std::make_unique<ReplayThread>();
      thread->run([&] { device.add_job_thread(std::this_thread::get_id()); });
    }
    device.set_event(e);
    ++result.events;
    std::optional<std::string> marker;
    std::optional<DevPtr> freed_va;  // an engine range the job freed
    switch (event.kind) {
      case Event::alloc: {
        const auto& a = trace.allocs[event.position].data;
        const StreamHandle stream = stream_for(a.stream);
        DevPtr va = 0;
        thread->run([&] {
          AllocRequest request;
          request.bytes = a.bytes;
          request.stream = stream;
          request.path = ranges::current();
          request.device = 0;
          request.api = a.api;
          va = engine.try_allocate(request);
        });
        ++result.allocations;
        traced_live += a.bytes;
        if (va == 0) {
          passthrough_live += a.bytes;
        } else {
          path_of_va[va] = a.path_id;
          traced_ptr_of_va[va] = a.ptr;
        }
        live[a.ptr] = Live{va, a.bytes, va != 0, stream};
        break;
      }
      case Event::free: {
        const auto& f = trace.frees[event.position].data;
        auto it = live.find(f.ptr);
        if (it == live.end()) {
          ++result.unmatched_frees;
          break;
        }
        const Live freed = it->second;
        live.erase(it);
        traced_live -= freed.bytes;
        if (freed.owned) {
          const StreamHandle stream = stream_for(f.stream);
          thread->run([&] { engine.free(freed.va, stream, false); });
          freed_va = freed.va;
        } else {
          passthrough_live -= freed.bytes;
        }
        break;
      }
      case Event::push: {
        const auto* path = trace.path(trace.ranges[event.position].data.path_id);
        const std::string name = path ? path->leaf : std::string("(unnamed)");
        if (model) marker = matcher.backward_module(name);
        thread->run([&] { ranges::push(registry.intern_name(name)); });
        break;
      }
      case Event::pop:
        thread->run([&] { ranges::pop(); });
        break;
    }
    engine.quiesce();  // the engine's decisions for this event, taken at once
    if (model) {
      model->event(event.time_ns, device.take(), marker ? &*marker : nullptr, names_of, freed_va);
      shifted[e] = model->now(event.time_ns);
    }
    observe(event.time_ns);
  }
  engine.quiesce();
  result.stats = engine.stats();
  // Close what the trace left open and stop the engine before the threads and device go.
  for (auto& [tid, thread] : threads) {
    thread->run([] {
      while (ranges::depth() > 0) ranges::pop();
    });
  }
  ranges::set_listener(nullptr);
  engine.shutdown();
  threads.clear();
  if (result.unmatched_frees > 0) {
    result.warnings.push_back(std::to_string(result.unmatched_frees) +
                              " frees of pointers the trace never allocated (allocated before tracing began?)");
  }
  if (!model) return result;

  model->finish();
  result.timed = true;
  result.timing = [&] {
    ReplayTiming timing = model->timing;
    timing.timed_peak_bytes = std::max(result.timing.timed_peak_bytes, result.predicted_peak_bytes);
    timing.timed_peak_time_ns = result.timing.timed_peak_time_ns;
    return timing;
  }();

  // Iterations: the traced and the predicted length of each whole one, by the shifted event times
  // (an iteration begins after the previous step's synchronisation, where the job's threads and its
  // GPU are equally late). The prediction is the traced median plus the median of what each
  // iteration gained: the two medians of lengths may come from different iterations of a noisy trace.
  auto shifted_at = [&](std::uint64_t time_ns) {
    // The predicted time of the last event at or before time_ns, plus what follows it as traced.
    auto it = std::upper_bound(events.begin(), events.end(), time_ns,
                               [](std::uint64_t t, const Event& ev) { return t < ev.time_ns; });
    if (it == events.begin()) return time_ns;
    const std::size_t k = static_cast<std::size_t>(it - events.begin()) - 1;
    return shifted[k] + (time_ns - events[k].time_ns);
  };
  std::vector<std::uint64_t> traced_lengths;
  std::vector<std::int64_t> added;
  for (std::size_t i = 0; i + 1 < iterations.size(); ++i) {
    const std::uint64_t traced = iterations[i].end_ns - iterations[i].begin_ns;
    traced_lengths.push_back(traced);
    added.push_back(static_cast<std::int64_t>(shifted_at(iterations[i].end_ns) - shifted_at(iterations[i].begin_ns)) -
                    static_cast<std::int64_t>(traced));
  }
  result.timing.iterations = iterations.size();
  if (!traced_lengths.empty()) {
    std::sort(traced_lengths.begin(), traced_lengths.end());
    std::sort(added.begin(), added.end());
    result.timing.traced_iteration_ns = traced_lengths[(traced_lengths.size() - 1) / 2];
    const std::int64_t gained = std::max<std::int64_t>(added[(added.size() - 1) / 2], 0);
    result.timing.added_iteration_ns = static_cast<std::uint64_t>(gained);
    result.timing.predicted_iteration_ns = result.timing.traced_iteration_ns + result.timing.added_iteration_ns;
  }
  result.timing.sync_wait_ns = backlog.median_sync_wait_ns();

  if (!replay_options.predicted_trace_path.empty()) {
    // The predicted run as a trace: the job's records on the predicted timeline, the engine's
    // copies and the stalls as the model placed them (on a thread of their own, tid 1).
    trace::TraceBuilder b;
    b.header() = trace.header;
    std::unordered_map<std::uint32_t, std::uint32_t> path_ids;
    auto path_id = [&](std::uint32_t id) -> std::uint32_t {
      if (id == 0) return 0;
      auto [it, inserted] = path_ids.try_emplace(id, 0);
      if (inserted) {
        const trace::ResolvedPath* path = trace.path(id);
        it->second = b.path(path ? path->full : trace.path_string(id), path && path->backward ? trace::kPathBackward : 0);
      }
      return it->second;
    };
    for (std::size_t e = 0; e < events.size(); ++e) {
      const Event& event = events[e];
      b.at(shifted[e], event.tid);
      switch (event.kind) {
        case Event::alloc: {
          const auto& a = trace.allocs[event.position].data;
          b.alloc(a.ptr, a.bytes, path_id(a.path_id), a.flags, a.api, a.stream, a.device);
          break;
        }
        case Event::free: {
          const auto& f = trace.frees[event.position].data;
          b.free(f.ptr, path_id(f.path_id), f.flags, f.api, f.stream, f.device);
          break;
        }
        case Event::push:
          b.range_push(path_id(trace.ranges[event.position].data.path_id));
          break;
        case Event::pop:
          b.range_pop(path_id(trace.ranges[event.position].data.path_id));
          break;
      }
    }
    // Copies name the traced allocation that was at their address when they were issued.
    // As the engine traces them: OFFLOAD_END when the pages are given back, none when they were kept.
    for (const auto& copy : model->d2h) {
      if (copy.cancelled) continue;
      b.at(copy.begin_ns, 1).page(trace::RecordType::offload_begin, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
      if (copy.pages_kept) continue;
      b.at(copy.given_back_ns != 0 ? copy.given_back_ns : copy.end_ns, 1)
          .page(trace::RecordType::offload_end, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
    }
    for (const auto& copy : model->h2d) {
      b.at(copy.begin_ns, 1).page(trace::RecordType::reload_begin, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
      b.at(copy.end_ns, 1).page(trace::RecordType::reload_end, copy.traced_ptr, copy.bytes, path_id(copy.path_id));
    }
    for (const auto& stall : model->stalls) {
      b.at(stall.end_ns, 1).stall(stall.end_ns - stall.begin_ns, path_id(stall.path_id));
    }
    b.at(model->now(trace.last_time_ns), 0).message(0, "predicted by actpage replay (simulated, not measured)");
    if (Status status = b.write_file(replay_options.predicted_trace_path); !status.ok()) return status;
  }
  return result;
}

}  // namespace actpage::engine

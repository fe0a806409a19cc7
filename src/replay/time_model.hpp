// Internal to src/replay: the time model of replay.hpp, fed one replayed event at a time with the
// device calls the engine made for it (RecordingDevice).
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <queue>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "replay/recording_device.hpp"
#include "replay/replay.hpp"

namespace actpage::engine {

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

}  // namespace actpage::engine

#include "engine/engine_core.hpp"

#include <string>

#include "common/log.hpp"
#include "common/units.hpp"

namespace actpage::engine {

EngineCore::EngineCore(Device& of_device)
    : device(of_device), granularity(of_device.granularity()), events(of_device.ordinal()) {}

EventHandle EngineCore::acquire_event() {
  if (!free_events_.empty()) {
    EventHandle event = free_events_.back();
    free_events_.pop_back();
    return event;
  }
  auto created = device.create_event();
  if (!created.ok()) {
    note_failure("creating an event", created.status());
    return {};
  }
  return *created;
}

void EngineCore::recycle_event(EventHandle event) {
  if (event.value != 0) free_events_.push_back(event);
}

void EngineCore::destroy_events() {
  for (EventHandle event : free_events_) (void)device.destroy_event(event);
  free_events_.clear();
}

Result<StreamHandle> EngineCore::create_stream(int priority, const char* what) {
  auto stream = device.create_stream(priority);
  if (!stream.ok()) {
    Status status = stream.status();
    return status.context(std::string("creating ") + what);
  }
  return *stream;
}

Status EngineCore::wait_for_copy(EventHandle done, const char* what, std::unique_lock<std::mutex>& lock) {
  lock.unlock();
  Status status = device.synchronize_event(done);
  for (int attempt = 1; !status.ok() && attempt < kCopyWaitAttempts; ++attempt) {
    if (attempt == 1) {
      lock.lock();
      note_failure(what, status);
      lock.unlock();
    }
    status = device.synchronize_event(done);
  }
  lock.lock();
  return status;
}

void EngineCore::note_failure(const char* what, const Status& status) {
  ++stats.failures;
  if (status.code() == ErrorCode::context_lost) {
    lose_context(what, status);
    return;
  }
  ACTPAGE_WARN_ONCE(std::string("engine.failure.") + what, "{} failed: {}; the job goes on without it", what,
                    status.message());
}

void EngineCore::lose_context(const char* what, const Status& status) {
  if (context_lost) return;
  // Nothing can be copied, mapped or waited for on this device again: retrying a reload (as for a
  // transient failure) would spin forever while the job's thread waited for it. Stop as shutdown
  // does, so that every wait ends: the job's next CUDA call reports the error itself, and the job
  // fails where it would fail without actpage instead of hanging.
  context_lost = true;
  stopping = true;
  const std::string pages = describe_pages_off_device ? describe_pages_off_device() : std::string();
  ACTPAGE_LOG_ERROR("{} failed: {}. The CUDA context is lost (a sticky error: something on the device touched memory "
                    "it must not, or a kernel failed); {} of activations offloaded by actpage cannot come back{}{}. "
                    "actpage stops paging; the job's next CUDA call reports the error",
                    what, status.message(), format_bytes(stats.offloaded_bytes_now), pages.empty() ? "" : "; ", pages);
  wake_everyone();
}

void EngineCore::wake_everyone() {
  work_cv.notify_all();
  reload_cv.notify_all();
  reload_done_cv.notify_all();
  issued_cv.notify_all();
  clock_cv.notify_all();
}

}  // namespace actpage::engine

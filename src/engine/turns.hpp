// Turns: the serialized mode of a device engine (replay), where its workers and the job's calls run
// one at a time, in an order fixed by the engine's state, never by the OS scheduler.
//
// Contract: off (the default) every call here is free and changes nothing. On (set before the
// engine starts): a job's call takes a turn only when no worker has work (as after quiesce()) and
// keeps it to its end, yielding it only while it waits for the workers; the workers then take turns,
// each from the moment it leaves its wait until it goes back to it, in the order next() gives (the
// VMM worker first, then the offload, reload and reload completion workers). Every method runs
// with the engine's lock held. Why: otherwise which worker gets the lock first decides which
// windows one unmap gives back, whether a cached range is trimmed before a reload takes it...: the
// same trace gave different device calls, and different predictions, from run to run.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>

namespace actpage::engine {

class EngineCore;

class Turns {
 public:
  enum class Turn : std::uint8_t { none, job, vmm, offload, reload, reload_completion };

  explicit Turns(EngineCore& core) : core_(core) {}
  // The worker with work that comes first (vmm, offload, reload, reload completion); none: all idle.
  void set_next(std::function<Turn()> next) { next_ = std::move(next); }
  void set_serialized(bool serialized) { serialized_ = serialized; }
  bool serialized() const { return serialized_; }

  // Whether `who` (a worker) may run now: always when not serialized.
  bool may_run(Turn who) const;
  // Whether no worker has work and no one holds a turn (quiesce(): the engine has settled).
  bool idle() const;
  // A job's call: waits until no worker has work and takes the turn.
  void take_job_turn(std::unique_lock<std::mutex>& lock);
  // cv.wait(lock, done), giving up the caller's turn meanwhile; it is taken back once `done` holds
  // and no other worker has work (the others would otherwise never get to run).
  template <class Done>
  void wait_yielding(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Done done);

  // Holds the turn of a worker or of a job's call for a scope.
  class Scope {
   public:
    Scope(Turns& turns, Turn who);
    ~Scope() { turns_.end(who_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Turns& turns_;
    Turn who_;
  };

 private:
  void end(Turn who);
  bool stopping() const;
  void wake_everyone();

  EngineCore& core_;
  std::function<Turn()> next_;
  bool serialized_ = false;
  Turn turn_ = Turn::none;  // who runs now
};

template <class Done>
void Turns::wait_yielding(std::unique_lock<std::mutex>& lock, std::condition_variable& cv, Done done) {
  if (!serialized_) {
    cv.wait(lock, done);
    return;
  }
  const Turn me = turn_;
  end(me);
  cv.wait(lock, [&] {
    if (stopping()) return true;
    if (!done() || turn_ != Turn::none) return false;
    const Turn next = next_();
    return next == Turn::none || next == me;
  });
  if (!stopping()) turn_ = me;
}

}  // namespace actpage::engine

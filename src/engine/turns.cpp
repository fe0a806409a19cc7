#include "engine/turns.hpp"

#include "engine/engine_core.hpp"

namespace actpage::engine {

Turns::Scope::Scope(Turns& turns, Turn who) : turns_(turns), who_(who) {
  if (turns_.serialized_) turns_.turn_ = who_;
}

bool Turns::may_run(Turn who) const {
  return !serialized_ || turn_ == who || (turn_ == Turn::none && next_() == who);
}

bool Turns::idle() const { return !serialized_ || (turn_ == Turn::none && next_() == Turn::none); }

void Turns::take_job_turn(std::unique_lock<std::mutex>& lock) {
  if (!serialized_) return;
  core_.issued_cv.wait(lock, [&] { return stopping() || (turn_ == Turn::none && next_() == Turn::none); });
  turn_ = Turn::job;
}

void Turns::end(Turn who) {
  if (!serialized_ || turn_ != who) return;
  turn_ = Turn::none;
  wake_everyone();  // whoever comes next may be waiting on any of them
}

bool Turns::stopping() const { return core_.stopping; }

void Turns::wake_everyone() { core_.wake_everyone(); }

}  // namespace actpage::engine

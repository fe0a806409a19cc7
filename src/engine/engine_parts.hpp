// EngineParts: how the parts of one device's engine reach each other.
//
// Contract: DeviceEngine owns every part and this table of references to them; a part keeps the
// table and calls another part only through it (the parts act on each other's state under the one
// lock, EngineCore::mutex, and none of them outlives the engine). Nothing here may be used before
// DeviceEngine's constructor has run.
#pragma once

namespace actpage::engine {

class AddressSpace;
class AutoSelect;
class AllocationTable;
class EngineCore;
class GpuClock;
class Groups;
class JobPool;
class OffloadPipeline;
class PageReturn;
class ReloadPipeline;
class SafetyModes;
class SavedTensors;
class TemporaryKeys;
class Turns;

struct EngineParts {
  EngineCore& core;
  Turns& turns;
  AllocationTable& allocations;
  Groups& groups;
  AddressSpace& space;
  OffloadPipeline& offload;
  ReloadPipeline& reload;
  PageReturn& pages;
  JobPool& job_pool;
  SafetyModes& safety;
  SavedTensors& saved;
  TemporaryKeys& temporaries;
  GpuClock& clock;
  AutoSelect& auto_select;
};

}  // namespace actpage::engine

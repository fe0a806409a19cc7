// The life of an offloadable allocation and of the group it belongs to.
//
//            release point        copy queued          copy done +          backward marker
//  resident ───────────► released ──────────► pending ──► offloading ──► unmapping ──► offloaded
//     ▲    (keep_last window)  │                 │            │ pages given back          │
//     │                        │ backward began  │ backward   │ backward asked            │ reload
//     └────────────────────────┴─────────────────┘ asked      └──(data never left)        ▼
//     └────────────────────────────── reload copy done ◄──────────────────────────── reloading
//
// A free by the job can arrive in any state; the allocation is then disposed of as soon as no copy
// touches it any more (its host copy dropped, its device range cached or unmapped).
#pragma once

#include <cstdint>

namespace actpage::engine {

enum class PageState : std::uint8_t {
  resident,    // on the device, not (yet) selected for offload
  released,    // past its release point, held back by keep_last (may still become pending)
  pending,     // queued for the D2H copy
  offloading,  // D2H copy in flight
  unmapping,   // copy done, device pages being given back by the worker
  offloaded,   // data only in host memory (fault mode: address unmapped; poison: overwritten)
  reloading,   // pages mapped back, H2D copy in flight
};

const char* page_state_name(PageState state);

}  // namespace actpage::engine

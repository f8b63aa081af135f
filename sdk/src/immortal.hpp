// immortal<T>(): one T per plugin library, built on first use and never destroyed.
//
// For state that a host may still reach while the process exits (a handle released from a host
// thread after static destructors ran): a destroyed static would be used after its end. The object
// lives in the library's static storage, not on the heap, so when the library is unloaded
// (dlclose, after the last deinit) nothing of it is left behind for a leak checker to report;
// whatever it allocated itself must be given back by then (see plugin_deinit).
//
// THREADING: the first call constructs (thread-safe, as any function-local static).
#pragma once

#include <new>

namespace sbx::sdk::detail {

template <class T>
T& immortal() {
  alignas(T) static unsigned char storage[sizeof(T)];
  static T* const object = ::new (static_cast<void*>(storage)) T();
  return *object;
}

}  // namespace sbx::sdk::detail

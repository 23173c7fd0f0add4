// What the tests of C++ module hooks share (torch_monitor/nn.h); apart from
// test_support.h so that tests without modules do not compile the nn headers.
#pragma once

#include <torch_monitor/nn.h>

namespace torch_monitor::test {

// Removes a hook handle at the end of the scope, even when an assertion
// fails first (the hook registry is process-global).
struct ScopedHook {
  nn::HookHandle handle;
  ~ScopedHook() {
    handle.remove();
  }
};

} // namespace torch_monitor::test

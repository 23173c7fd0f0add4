#pragma once

// Every reducer: the Reducer interface, the FoldReducer machinery (History,
// Criterion), the table of the ten inferno reducer kinds, and makeReducer().
#include <torch_monitor/reducers/criterion.h>
#include <torch_monitor/reducers/factory.h>
#include <torch_monitor/reducers/fold_reducer.h>
#include <torch_monitor/reducers/history.h>
#include <torch_monitor/reducers/kinds.h>
#include <torch_monitor/reducers/reducer.h>

#pragma once

// Every reducer: the Reducer interface, the FoldReducer machinery (History,
// Criterion) and the ten inferno reducers, plus makeReducer().
#include <torch_monitor/reducers/criterion.h>
#include <torch_monitor/reducers/factory.h>
#include <torch_monitor/reducers/fold_reducer.h>
#include <torch_monitor/reducers/general.h>
#include <torch_monitor/reducers/history.h>
#include <torch_monitor/reducers/reducer.h>
#include <torch_monitor/reducers/stats.h>
#include <torch_monitor/reducers/trace.h>

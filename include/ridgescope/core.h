// ridgescope/core.h — umbrella header of the torch-free core: categories, events, the
// recorder that writes traces (and the flight recorder that bounds them), the reader, the ledger, the analysis and the report.
// Thread-safety is stated in each header.
#pragma once

#include "ridgescope/analysis.h"
#include "ridgescope/category.h"
#include "ridgescope/phase.h"
#include "ridgescope/clock.h"
#include "ridgescope/event.h"
#include "ridgescope/flight.h"
#include "ridgescope/ledger.h"
#include "ridgescope/recorder.h"
#include "ridgescope/report.h"
#include "ridgescope/snapshot.h"
#include "ridgescope/trace_format.h"
#include "ridgescope/trace_reader.h"

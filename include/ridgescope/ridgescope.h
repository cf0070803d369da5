// ridgescope/ridgescope.h — umbrella header for C++ trainers: the core (ridgescope/core.h)
// and the libtorch session API (ridgescope/session.h). Code that must not depend on torch
// includes ridgescope/core.h instead. Thread-safety is stated in each header.
#pragma once

#include "ridgescope/core.h"
#include "ridgescope/session.h"

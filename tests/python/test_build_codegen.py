"""Specification of how the shared products' code is generated (cmake/RidgescopeHelpers.cmake:
ridgescope_set_codegen, ridgescope_set_shared_link).

* Every call from one of ridgescope's functions to another inside the Python module (and inside
  libridgescope, where the build tree has it) is a direct call: none goes through a PLT stub.
  The recording's hot path crosses a dozen such calls for every allocation; a PLT stub and its
  GOT slot are one more instruction line and one more data line to fetch each time
  (docs/performance.md, "Where the training thread's time goes: instruction fetches").
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

import ridgescope._C as native

ROOT = Path(__file__).resolve().parents[2]
# A call through the PLT to a function of ridgescope's own namespace, as objdump names it.
PLT_CALL = re.compile(r"\b(?:call|jmp)\s+[0-9a-f]+ <(ridgescope::.*)@plt>\s*$", re.MULTILINE)


def plt_calls_to_own_functions(library: Path) -> list[str]:
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", str(library)],
                         capture_output=True, text=True, check=True).stdout
    return sorted(set(PLT_CALL.findall(out)))


needs_objdump = pytest.mark.skipif(shutil.which("objdump") is None, reason="objdump (binutils) is not installed")


@needs_objdump
def test_the_python_module_calls_its_own_functions_directly():
    # Given the module this test imports
    module = Path(native.__file__)
    # When its code is disassembled, then no call to a ridgescope function goes through the PLT
    assert plt_calls_to_own_functions(module) == []


@needs_objdump
def test_the_check_sees_a_call_through_the_plt():
    # Given objdump's spelling of a PLT call and of a direct one
    through_plt = ("  3bd0f:\tcall   3aa20 <ridgescope::free_space(std::vector<ridgescope::AddressRange, "
                   "std::allocator<ridgescope::AddressRange> >)@plt>\n"
                   "  9a5f0:\tjmp    3a1d0 <ridgescope::Recorder::record(ridgescope::Event)@plt>\n")
    direct = ("  9a5f0:\tcall   c2e50 <ridgescope::Recorder::record(ridgescope::Event)>\n"
              "  9a600:\tcall   3a000 <pthread_mutex_lock@plt>\n")
    # Then the check names both calls of the first and none of the second
    assert PLT_CALL.findall(through_plt) == [
        "ridgescope::free_space(std::vector<ridgescope::AddressRange, std::allocator<ridgescope::AddressRange> >)",
        "ridgescope::Recorder::record(ridgescope::Event)"]
    assert PLT_CALL.findall(direct) == []


@needs_objdump
def test_libridgescope_calls_its_own_functions_directly():
    # Given the C++ package's library, where this build tree has one (RIDGESCOPE_INSTALL_CPP)
    found = sorted((ROOT / "build" / "py" / "csrc" / "cpp_package").glob("libridgescope.so.*.*"))
    if not found:
        pytest.skip("build/py has no libridgescope (configured without RIDGESCOPE_INSTALL_CPP)")
    # Then no call to a ridgescope function goes through the PLT there either
    assert plt_calls_to_own_functions(found[-1]) == []

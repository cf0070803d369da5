// Specification of the one rule that says which source files are library code
// (csrc/core/util/library_files.h): the live site capture, a snapshot's sites and the reports'
// `library` flag all ask it.
#include <string>
#include <vector>

#include "catch.h"
#include "library_files.h"

using ridgescope::detail::code_roots_from_sites_metadata;
using ridgescope::detail::CodeRoots;
using ridgescope::detail::is_library_file;

SCENARIO("files are library code by their path alone, as a snapshot from another machine is judged",
         "[core][library_files]") {
  GIVEN("torch's files, wherever torch is") {
    for (const char* f : {"/opt/venv/lib/python3.12/site-packages/torch/nn/modules/module.py",
                          "/home/dev/pytorch/torch/_tensor.py", "torch/optim/adamw.py",
                          "C:\\Python311\\Lib\\site-packages\\torch\\nn\\functional.py"}) {
      INFO(f);
      CHECK(is_library_file(f));
    }
  }
  GIVEN("code generated for torch: torch.fx's modules and Inductor's cache") {
    CHECK(is_library_file("<eval_with_key>.3"));
    CHECK(is_library_file("/tmp/torchinductor_alice/ab/cabcdef.py"));
  }
  GIVEN("the standard library, frozen modules, ridgescope installed and op-wrapping packages") {
    for (const char* f : {"/usr/lib/python3.11/contextlib.py", "/opt/conda/lib/python3.10/threading.py",
                          "/usr/lib64/python3.13t/runpy.py", "/home/u/.pyenv/versions/3.12.1/lib/python3.12/json/__init__.py",
                          "C:\\Python311\\Lib\\runpy.py", "<frozen runpy>",
                          "/opt/venv/lib/python3.11/site-packages/ridgescope/_session.py",
                          // packages that wrap one tensor op, as torch.nn.functional does
                          "/venv/lib/python3.12/site-packages/einops/_backends.py",
                          "/venv/lib/python3.12/site-packages/triton/runtime/jit.py",
                          "/venv/lib/python3.12/site-packages/flash_attn/flash_attn_interface.py"}) {
      INFO(f);
      CHECK(is_library_file(f));
    }
  }
  GIVEN("the user's code, and third-party packages installed in the standard library's tree") {
    for (const char* f : {"/home/me/proj/train.py", "train.py", "/home/me/proj/model.py",
                          "/opt/venv/lib/python3.12/site-packages/transformers/models/llama/modeling_llama.py",
                          "/usr/lib/python3/dist-packages/numpy/core/numeric.py",
                          "/usr/lib/python3.11/site-packages/accelerate/accelerator.py",
                          "C:\\Python311\\Lib\\site-packages\\accelerate\\accelerator.py",
                          "/home/me/torchvision_models/resnet.py", "/home/me/lib/pythonic/tool.py", "<stdin>"}) {
      INFO(f);
      CHECK_FALSE(is_library_file(f));
    }
  }
}

SCENARIO("the directories the tracking process knew add to the patterns", "[core][library_files]") {
  GIVEN("a custom Inductor cache and a stdlib outside any lib/pythonX.Y") {
    CodeRoots roots;
    roots.library = {"/scratch/inductor-cache/"};
    roots.stdlib = {"/opt/python/stdlib/"};
    THEN("files under them are library code, except packages installed inside the stdlib") {
      CHECK(is_library_file("/scratch/inductor-cache/xy/cxy.py", &roots));
      CHECK(is_library_file("/opt/python/stdlib/contextlib.py", &roots));
      CHECK_FALSE(is_library_file("/opt/python/stdlib/site-packages/transformers/trainer.py", &roots));
      CHECK_FALSE(is_library_file("/scratch/inductor-cache/xy/cxy.py"));  // without the roots: the user's
    }
  }
  GIVEN("the sites metadata a live trace records") {
    const CodeRoots r = code_roots_from_sites_metadata(
        R"({"mode": "python", "python_frames": true, "reason": "", "library_roots": ["/a/torch/", "/b/"],)"
        R"( "stdlib_roots": ["/usr/lib/python3.11/"]})");
    THEN("its roots are read; metadata without them, or not JSON, gives none") {
      CHECK(r.library == std::vector<std::string>{"/a/torch/", "/b/"});
      CHECK(r.stdlib == std::vector<std::string>{"/usr/lib/python3.11/"});
      CHECK(code_roots_from_sites_metadata(R"({"mode": "site"})").empty());
      CHECK(code_roots_from_sites_metadata("{not json").empty());
      CHECK(code_roots_from_sites_metadata(R"({"library_roots": [1, "", "/x/"]})").library ==
            std::vector<std::string>{"/x/"});
    }
  }
}

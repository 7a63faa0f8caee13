#include "kernels/cuda/cublaslt_library.h"

#include <dlfcn.h>

#include <string>

#include "core/error.h"

namespace fab::cuda {
namespace {

void* open_library() {
  // The soname of the toolkit we compile against first, then the unversioned name; the toolkit's
  // own lib folder last, for machines where it is not on the loader's path.
  for (const char* name : {"libcublasLt.so.13", "libcublasLt.so", FAB_CUDA_LIBRARY_DIR "/libcublasLt.so.13"})
    if (void* handle = ::dlopen(name, RTLD_NOW | RTLD_LOCAL)) return handle;
  const char* why = ::dlerror();
  FAB_CHECK(false, "cannot open cuBLASLt (libcublasLt.so.13): {}", why ? why : "not found");
  return nullptr;
}

template <typename F>
void bind(void* library, F& slot, const char* name) {
  slot = reinterpret_cast<F>(::dlsym(library, name));
  FAB_CHECK(slot != nullptr, "libcublasLt has no {}", name);
}

CublasLt load() {
  void* library = open_library();
  CublasLt lt{};
  bind(library, lt.Create, "cublasLtCreate");
  bind(library, lt.GetStatusName, "cublasLtGetStatusName");
  bind(library, lt.GetStatusString, "cublasLtGetStatusString");
  bind(library, lt.Matmul, "cublasLtMatmul");
  bind(library, lt.MatmulAlgoGetHeuristic, "cublasLtMatmulAlgoGetHeuristic");
  bind(library, lt.MatmulDescCreate, "cublasLtMatmulDescCreate");
  bind(library, lt.MatmulDescSetAttribute, "cublasLtMatmulDescSetAttribute");
  bind(library, lt.MatmulPreferenceCreate, "cublasLtMatmulPreferenceCreate");
  bind(library, lt.MatmulPreferenceDestroy, "cublasLtMatmulPreferenceDestroy");
  bind(library, lt.MatmulPreferenceSetAttribute, "cublasLtMatmulPreferenceSetAttribute");
  bind(library, lt.MatrixLayoutCreate, "cublasLtMatrixLayoutCreate");
  return lt;
}

}  // namespace

const CublasLt& cublaslt() {
  static const CublasLt lt = load();  // thread-safe once
  return lt;
}

}  // namespace fab::cuda

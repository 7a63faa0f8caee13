#pragma once
// cuBLASLt, opened with dlopen the first time a GEMM runs on a GPU. Linking it instead made every
// fabrica process map the 540 MB library at start (about 210 MB resident and 0.1 s, with or
// without a GPU). The declarations still come from cublasLt.h, so the types are checked.
#include <cublasLt.h>

namespace fab::cuda {

struct CublasLt {
  decltype(&::cublasLtCreate) Create;
  decltype(&::cublasLtGetStatusName) GetStatusName;
  decltype(&::cublasLtGetStatusString) GetStatusString;
  decltype(&::cublasLtMatmul) Matmul;
  decltype(&::cublasLtMatmulAlgoGetHeuristic) MatmulAlgoGetHeuristic;
  decltype(&::cublasLtMatmulDescCreate) MatmulDescCreate;
  decltype(&::cublasLtMatmulDescSetAttribute) MatmulDescSetAttribute;
  decltype(&::cublasLtMatmulPreferenceCreate) MatmulPreferenceCreate;
  decltype(&::cublasLtMatmulPreferenceDestroy) MatmulPreferenceDestroy;
  decltype(&::cublasLtMatmulPreferenceSetAttribute) MatmulPreferenceSetAttribute;
  decltype(&::cublasLtMatrixLayoutCreate) MatrixLayoutCreate;
};

// Opens libcublasLt.so.13 (the loader's search path: LD_LIBRARY_PATH, the toolkit's lib folder)
// on first use; throws a fab::Error naming the library or the missing symbol.
const CublasLt& cublaslt();

}  // namespace fab::cuda

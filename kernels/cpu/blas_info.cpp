#include <cblas.h>

#include <cstdlib>

#include "kernels/backend_info.h"

// OpenBLAS exports these beside the CBLAS interface.
extern "C" {
char* openblas_get_config(void);
char* openblas_get_corename(void);
int openblas_get_parallel(void);
int openblas_get_num_threads(void);
}

namespace llmtrain::kernels {

BlasInfo blas_info() {
  BlasInfo b;
  b.config = openblas_get_config();
  b.name = "OpenBLAS";
  // The config string starts with "OpenBLAS 0.3.21 ..." on current versions.
  if (b.config.rfind("OpenBLAS ", 0) == 0) {
    auto end = b.config.find(' ', 9);
    b.name = b.config.substr(0, end);
  }
  switch (openblas_get_parallel()) {
    case 0:
      b.threading = "serial";
      break;
    case 1:
      b.threading = "pthreads";
      break;
    case 2:
      b.threading = "OpenMP";
      break;
    default:
      b.threading = "unknown";
      break;
  }
  b.threads = openblas_get_num_threads();
  b.coretype = openblas_get_corename();
  if (const char* env = std::getenv("OPENBLAS_CORETYPE")) b.coretype += std::string(" (OPENBLAS_CORETYPE=") + env + ")";
  return b;
}

}  // namespace llmtrain::kernels

# Library dependencies, all from Debian packages (scripts/setup.sh installs them).
find_package(CLI11 CONFIG REQUIRED)
find_package(yaml-cpp REQUIRED)            # target: yaml-cpp (no namespace in 0.7)
find_package(fmt REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(MPI REQUIRED COMPONENTS CXX)
find_package(OpenMP REQUIRED COMPONENTS CXX)
find_package(Threads REQUIRED)
find_package(ZLIB REQUIRED)
find_package(PkgConfig REQUIRED)
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
# cairo draws `llmtrain plot`'s charts (PNG and SVG surfaces, its toy text API): libcairo2-dev.
pkg_check_modules(CAIRO REQUIRED IMPORTED_TARGET cairo)

# OpenBLAS: the OpenMP variant (libopenblas-openmp-dev), so BLAS threads share our OpenMP pool.
set(BLA_VENDOR OpenBLAS)
find_package(BLAS REQUIRED)
find_path(LLMTRAIN_CBLAS_INCLUDE cblas.h
  PATHS /usr/include/x86_64-linux-gnu/openblas-openmp /usr/include/x86_64-linux-gnu/openblas-serial
        /usr/include/openblas /usr/include/x86_64-linux-gnu /usr/include
  NO_DEFAULT_PATH)
if(NOT LLMTRAIN_CBLAS_INCLUDE)
  message(FATAL_ERROR "cblas.h not found: install libopenblas-openmp-dev (scripts/setup.sh does)")
endif()
add_library(llmtrain_blas INTERFACE)
target_link_libraries(llmtrain_blas INTERFACE ${BLAS_LIBRARIES})
target_include_directories(llmtrain_blas INTERFACE ${LLMTRAIN_CBLAS_INCLUDE})

if(LLMTRAIN_TESTS)
  find_package(GTest REQUIRED)
endif()

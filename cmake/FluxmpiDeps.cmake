# Finds every dependency; a missing one stops configuration with the Debian package to install.
include(FindPkgConfig)

macro(fluxmpi_need found what package)
  if(NOT ${found})
    message(FATAL_ERROR "fluxmpi: ${what} not found. Install the Debian package '${package}' "
                        "(scripts/setup.sh installs everything the build needs).")
  endif()
endmacro()

find_package(nlohmann_json QUIET)
fluxmpi_need(nlohmann_json_FOUND "nlohmann-json" "nlohmann-json3-dev")

find_package(PNG QUIET)
fluxmpi_need(PNG_FOUND "libpng" "libpng-dev")

# Input images (src/io/image_file.cpp): libjpeg-turbo is the JPEG decoder Pillow uses.
find_package(JPEG QUIET)
fluxmpi_need(JPEG_FOUND "libjpeg (libjpeg-turbo)" "libjpeg-dev")

pkg_check_modules(WEBP QUIET IMPORTED_TARGET libwebp)
fluxmpi_need(WEBP_FOUND "libwebp" "libwebp-dev")

find_package(ICU QUIET COMPONENTS uc i18n)
fluxmpi_need(ICU_FOUND "ICU (Unicode normalisation, case mapping and regex)" "libicu-dev")

# Linked by the fluxmpi_spm shim only (see CMakeLists.txt).
pkg_check_modules(SENTENCEPIECE QUIET IMPORTED_TARGET sentencepiece)
fluxmpi_need(SENTENCEPIECE_FOUND "sentencepiece" "libsentencepiece-dev")
find_library(SENTENCEPIECE_TRAIN_LIBRARY sentencepiece_train HINTS ${SENTENCEPIECE_LIBRARY_DIRS})
fluxmpi_need(SENTENCEPIECE_TRAIN_LIBRARY "sentencepiece trainer library" "libsentencepiece-dev")

if(FLUXMPI_WITH_TORCH)
  find_package(Torch QUIET)
  fluxmpi_need(Torch_FOUND "libtorch" "libtorch-dev")
  # The OpenMP of the compiler (libtorch's CPU threads are OpenMP's): fluxmpi's CPU kernels need it
  # for at::parallel_for to spread over them (CMakeLists.txt).
  find_package(OpenMP QUIET COMPONENTS CXX)
  fluxmpi_need(OpenMP_CXX_FOUND "OpenMP for C++" "g++ (libgomp)")

  find_package(MPI QUIET COMPONENTS C)
  fluxmpi_need(MPI_C_FOUND "MPI" "libopenmpi-dev")

  set(HDF5_PREFER_PARALLEL FALSE)
  find_package(HDF5 QUIET COMPONENTS C)
  fluxmpi_need(HDF5_FOUND "HDF5 (C library)" "libhdf5-dev")
  if(NOT TARGET hdf5::hdf5)
    add_library(hdf5::hdf5 INTERFACE IMPORTED)
    target_include_directories(hdf5::hdf5 INTERFACE ${HDF5_C_INCLUDE_DIRS} ${HDF5_INCLUDE_DIRS})
    target_link_libraries(hdf5::hdf5 INTERFACE ${HDF5_C_LIBRARIES} ${HDF5_LIBRARIES})
  endif()

  find_package(Boost 1.70 QUIET COMPONENTS program_options)
  fluxmpi_need(Boost_FOUND "Boost.Program_options" "libboost-program-options-dev")
endif()

if(FLUXMPI_BUILD_TESTS)
  find_package(GTest QUIET)
  fluxmpi_need(GTest_FOUND "GoogleTest" "libgtest-dev")
endif()

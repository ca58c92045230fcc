# The native libraries the wheel carries inside libtorch_shards.so (TORCH_SHARDS_BUNDLED_DEPENDENCIES=ON,
# make wheel): HDF5, libaec (szip), c-blosc, lz4, zstd and zlib, built from source as static,
# position-independent archives and linked in with their symbols hidden, so the installed package
# needs nothing of the system but glibc and libstdc++, and never clashes with the HDF5 that h5py
# or another wheel loads into the same process.
#
# The sources are the original tarballs of the Debian 12 packages the source build links against
# (same releases, so the wheel decodes exactly what the tests checked), each checked against the
# SHA-256 in Debian's signed .dsc (libaec: Debian's archives, see below). HDF5 is built without its
# read-only S3 driver, so no libcurl or TLS library comes with it; c-blosc without snappy, as
# numcodecs builds it.
#
# Defines torch_shards_io_dependencies (an INTERFACE target for torch_shards_io) and
# TORCH_SHARDS_BUNDLED_ARCHIVES (the archives whose symbols the shared library hides).
include(ExternalProject)

set(TORCH_SHARDS_SOURCES_URL "http://deb.debian.org/debian/pool/main"
    CACHE STRING "Where the bundled libraries' source tarballs are downloaded from (a Debian mirror's pool)")
set(TORCH_SHARDS_DOWNLOAD_DIR "${PROJECT_BINARY_DIR}/downloads"
    CACHE PATH "Where the bundled libraries' source tarballs are kept between builds")
set(BUNDLED_PREFIX "${PROJECT_BINARY_DIR}/bundled")
set(LIB ${BUNDLED_PREFIX}/lib)
set(INCLUDE ${BUNDLED_PREFIX}/include)

find_program(CCACHE_PROGRAM ccache)
set(BUNDLED_CMAKE_ARGS
  -DCMAKE_BUILD_TYPE=Release
  -DCMAKE_INSTALL_PREFIX=${BUNDLED_PREFIX}
  -DCMAKE_INSTALL_LIBDIR=lib
  -DCMAKE_PREFIX_PATH=${BUNDLED_PREFIX}
  -DCMAKE_POSITION_INDEPENDENT_CODE=ON
  -DCMAKE_C_FLAGS=-fPIC
  -DBUILD_SHARED_LIBS=OFF)
if(CCACHE_PROGRAM)
  list(APPEND BUNDLED_CMAKE_ARGS -DCMAKE_C_COMPILER_LAUNCHER=${CCACHE_PROGRAM})
endif()

# bundled_library(<name> <pool path> <sha256>: lib<name>.a [SOURCE_SUBDIR dir] [DEPENDS targets] [ARGS cmake args])
function(bundled_library name path sha256)
  cmake_parse_arguments(PARSE_ARGV 3 ARG "" "SOURCE_SUBDIR" "DEPENDS;ARGS")
  ExternalProject_Add(bundled_${name}
    URL ${TORCH_SHARDS_SOURCES_URL}/${path}
    URL_HASH SHA256=${sha256}
    DOWNLOAD_DIR ${TORCH_SHARDS_DOWNLOAD_DIR}
    DOWNLOAD_EXTRACT_TIMESTAMP OFF
    SOURCE_SUBDIR ${ARG_SOURCE_SUBDIR}
    DEPENDS ${ARG_DEPENDS}
    CMAKE_ARGS ${BUNDLED_CMAKE_ARGS} ${ARG_ARGS}
    INSTALL_DIR ${BUNDLED_PREFIX}
    BUILD_BYPRODUCTS ${LIB}/lib${name}.a
    LOG_CONFIGURE ON LOG_BUILD ON LOG_INSTALL ON LOG_OUTPUT_ON_FAILURE ON)
endfunction()

# zlib's CMake build needs the Windows resource file Debian's tarball leaves out: its configure script.
ExternalProject_Add(bundled_zlib
  URL ${TORCH_SHARDS_SOURCES_URL}/z/zlib/zlib_1.2.13.dfsg.orig.tar.bz2
  URL_HASH SHA256=71feb7947e3c00ef125f83b79a4e529bde31171e5babe48b391f06758d1ab0a1
  DOWNLOAD_DIR ${TORCH_SHARDS_DOWNLOAD_DIR}
  DOWNLOAD_EXTRACT_TIMESTAMP OFF
  BUILD_IN_SOURCE ON
  CONFIGURE_COMMAND ${CMAKE_COMMAND} -E env "CFLAGS=-O2 -fPIC" ./configure --static --prefix=${BUNDLED_PREFIX}
  BUILD_COMMAND make libz.a
  INSTALL_COMMAND make install
  BUILD_BYPRODUCTS ${LIB}/libz.a
  LOG_CONFIGURE ON LOG_BUILD ON LOG_INSTALL ON LOG_OUTPUT_ON_FAILURE ON)
bundled_library(lz4 l/lz4/lz4_1.9.4.orig.tar.gz
  0b0e3aa07c8c063ddf40b082bdf7e37a1562bda40a0ff5272957f3e987e0e54b
  SOURCE_SUBDIR build/cmake
  ARGS -DBUILD_STATIC_LIBS=ON -DLZ4_BUILD_CLI=OFF -DLZ4_BUILD_LEGACY_LZ4C=OFF)
bundled_library(zstd libz/libzstd/libzstd_1.5.4+dfsg2.orig.tar.xz
  8cf4bbb65e77ec348d052c8d6230eba66d435bddf64c8b5be2fcb16880c19953
  SOURCE_SUBDIR build/cmake
  ARGS -DZSTD_BUILD_SHARED=OFF -DZSTD_BUILD_STATIC=ON -DZSTD_BUILD_PROGRAMS=OFF -DZSTD_BUILD_TESTS=OFF)
# libaec (szip): Debian's own archives of the same release (libaec-dev, which libhdf5-dev brings) are
# position-independent, unlike the other libraries', and its source tarball is not on every mirror.
find_library(AEC_ARCHIVE libaec.a)
find_library(SZ_ARCHIVE libsz.a)
find_path(SZ_INCLUDE_DIR szlib.h)
if(NOT AEC_ARCHIVE OR NOT SZ_ARCHIVE OR NOT SZ_INCLUDE_DIR)
  message(FATAL_ERROR "The wheel links libaec's static archives (libaec.a, libsz.a, szlib.h): apt-get install libaec-dev")
endif()
add_custom_target(bundled_aec
  COMMAND ${CMAKE_COMMAND} -E make_directory ${LIB} ${INCLUDE}
  COMMAND ${CMAKE_COMMAND} -E copy ${AEC_ARCHIVE} ${SZ_ARCHIVE} ${LIB}
  COMMAND ${CMAKE_COMMAND} -E copy ${SZ_INCLUDE_DIR}/szlib.h ${SZ_INCLUDE_DIR}/libaec.h ${INCLUDE}
  BYPRODUCTS ${LIB}/libaec.a ${LIB}/libsz.a)
bundled_library(blosc c/c-blosc/c-blosc_1.21.3+ds.orig.tar.xz
  36a5ca0904135be7b6da02cc93adda2e34fec98286b28172e166f8cad79c8fab
  DEPENDS bundled_zlib bundled_lz4 bundled_zstd
  ARGS -DBUILD_STATIC=ON -DBUILD_SHARED=OFF -DBUILD_TESTS=OFF -DBUILD_FUZZERS=OFF -DBUILD_BENCHMARKS=OFF
       -DDEACTIVATE_SNAPPY=ON -DPREFER_EXTERNAL_LZ4=ON -DPREFER_EXTERNAL_ZLIB=ON -DPREFER_EXTERNAL_ZSTD=ON
       -DZLIB_LIBRARY=${LIB}/libz.a -DZLIB_INCLUDE_DIR=${INCLUDE})
bundled_library(hdf5 h/hdf5/hdf5_1.10.8+repack1.orig.tar.gz
  7b38e58ff83b13fd8959a90b13bf896bc318ba096c940ab0847abf3ad41a0b31
  DEPENDS bundled_zlib bundled_aec
  ARGS -DONLY_SHARED_LIBS=OFF -DHDF5_BUILD_TOOLS=OFF -DHDF5_BUILD_UTILS=OFF -DHDF5_BUILD_EXAMPLES=OFF
       -DBUILD_TESTING=OFF -DHDF5_BUILD_HL_LIB=OFF -DHDF5_BUILD_CPP_LIB=OFF -DHDF5_BUILD_FORTRAN=OFF
       -DHDF5_BUILD_JAVA=OFF -DHDF5_ENABLE_ROS3_VFD=OFF -DHDF5_ENABLE_HDFS=OFF -DHDF5_ENABLE_THREADSAFE=OFF
       -DHDF5_ENABLE_Z_LIB_SUPPORT=ON -DZLIB_LIBRARY=${LIB}/libz.a -DZLIB_INCLUDE_DIR=${INCLUDE}
       -DHDF5_ENABLE_SZIP_SUPPORT=ON -DHDF5_ENABLE_SZIP_ENCODING=ON -DSZIP_LIBRARY=${LIB}/libsz.a
       -DSZIP_INCLUDE_DIR=${INCLUDE} -DHDF5_INSTALL_LIB_DIR=lib)

# Link order: each archive before the ones it uses.
set(TORCH_SHARDS_BUNDLED_ARCHIVES libhdf5.a libsz.a libaec.a libblosc.a liblz4.a libzstd.a libz.a)
add_library(torch_shards_io_dependencies INTERFACE)
target_include_directories(torch_shards_io_dependencies INTERFACE ${INCLUDE})
foreach(archive IN LISTS TORCH_SHARDS_BUNDLED_ARCHIVES)
  target_link_libraries(torch_shards_io_dependencies INTERFACE ${LIB}/${archive})
endforeach()
target_link_libraries(torch_shards_io_dependencies INTERFACE Threads::Threads ${CMAKE_DL_LIBS} m)
target_compile_definitions(torch_shards_io_dependencies INTERFACE TORCH_SHARDS_BUNDLED_DEPENDENCIES)
add_custom_target(torch_shards_bundled_dependencies DEPENDS bundled_hdf5 bundled_blosc)

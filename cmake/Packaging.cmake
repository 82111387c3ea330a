# Debian packages of ckpt (`cpack -G DEB` in a build directory configured with
# -DCMAKE_INSTALL_PREFIX=/usr; tools/package.sh does both). One package per install
# component:
#   ckptd              the daemon, ckptctl, ckpt-shard-reader, the unit, sysusers.d, the
#                      configuration (a conffile), maintainer scripts (cmake/debian/)
#   libckptclient0     libckptclient.so.0
#   libckptclient-cuda0 libckptclient-cuda.so.0, its GPU plugin (when nvcc was found): the
#                      CUDA runtime is linked in; it needs the NVIDIA driver, and NCCL for
#                      collective loads, both opened at run time
#   libckpttorch0      libckpttorch.so.0 (when libtorch was found)
#   libckptclient-dev  headers, link names, the CMake package (find_package(ckpt); its
#                      component torch comes with libckpttorch0)
# Dependencies on Debian packages come from dpkg-shlibdeps; between these packages from
# the component dependencies below.
if(NOT CMAKE_INSTALL_PREFIX STREQUAL "/usr")
  message(STATUS "ckpt: CMAKE_INSTALL_PREFIX is ${CMAKE_INSTALL_PREFIX}; Debian packages want /usr (tools/package.sh)")
endif()

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "ckpt")
set(CPACK_PACKAGE_VENDOR "ckpt")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "ckpt maintainers <ckpt-maintainers@localhost>")
# No CPACK_PACKAGE_DESCRIPTION_SUMMARY: each package's first description line is its own.
set(CPACK_PACKAGING_INSTALL_PREFIX "${CMAKE_INSTALL_PREFIX}")
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_ALL daemon client dev)
if(TARGET ckpttorch)
  list(APPEND CPACK_COMPONENTS_ALL torch)
endif()
if(TARGET ckptclient-cuda)
  list(APPEND CPACK_COMPONENTS_ALL cuda)
endif()
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_PACKAGE_SECTION "misc")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)  # shlibs, and ldconfig in the libraries' scripts
set(CPACK_DEBIAN_ENABLE_COMPONENT_DEPENDS ON)
# Libraries of this build that a package's binaries link (ckpt-shard-reader ->
# libckptclient.so.0) are found here, not as a Debian package: the component
# dependencies name the package that ships them.
set(ckpt_private_dirs "${CMAKE_LIBRARY_OUTPUT_DIRECTORY}")
# The GPU plugin links no NVIDIA library (the CUDA runtime is static; the driver and NCCL
# are dlopened), so no package needs to name one: a node without a GPU installs it too.
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS_PRIVATE_DIRS "${ckpt_private_dirs}")

set(CPACK_COMPONENT_DAEMON_DEPENDS client)
set(CPACK_COMPONENT_TORCH_DEPENDS client)
set(CPACK_COMPONENT_CUDA_DEPENDS client)
set(CPACK_COMPONENT_DEV_DEPENDS client)

set(CPACK_DEBIAN_DAEMON_PACKAGE_NAME "ckptd")
set(CPACK_DEBIAN_DAEMON_PACKAGE_SECTION "admin")
set(CPACK_DEBIAN_DAEMON_PACKAGE_DEPENDS "systemd (>= 247) | systemd-standalone-sysusers, passwd")
set(CPACK_DEBIAN_DAEMON_DESCRIPTION "checkpoint server: one copy of each checkpoint per node in shared memory
The daemon ckptd (a Type=notify systemd service), its CLI ckptctl, ckpt-shard-reader
(a minimal client that attaches), the unit, its users and groups (sysusers.d) and the
configuration /etc/ckptd/ckptd.conf. Installing does not enable or start the service:
set model-root and memory-budget first, then systemctl enable --now ckptd.")
set(CPACK_DEBIAN_CLIENT_PACKAGE_NAME "libckptclient0")
set(CPACK_DEBIAN_CLIENT_PACKAGE_SECTION "libs")
set(CPACK_DEBIAN_CLIENT_DESCRIPTION "ckpt client library: attach to ckptd's checkpoints read-only
libckptclient.so.0 (C and C++ APIs): zero-copy views and shards of the checkpoints a
ckptd serves. Loads on nodes without any GPU library; the GPU copy engine
is in libckptclient-cuda0.")
set(CPACK_DEBIAN_CUDA_PACKAGE_NAME "libckptclient-cuda0")
set(CPACK_DEBIAN_CUDA_PACKAGE_SECTION "libs")
set(CPACK_DEBIAN_CUDA_DESCRIPTION "ckpt client library: the CUDA copy engine
libckptclient-cuda.so.0, opened by libckptclient at the first GPU call: shards copied
straight from shared memory into GPU memory, and NCCL collective loads. The CUDA
${CUDAToolkit_VERSION_MAJOR} runtime is linked in: it needs the NVIDIA driver (libcuda.so.1) and, for
collective loads, NCCL 2 >= 2.14 (libnccl.so.2, e.g. PyTorch's), both found at run time.")
set(CPACK_DEBIAN_TORCH_PACKAGE_NAME "libckpttorch0")
set(CPACK_DEBIAN_TORCH_PACKAGE_SECTION "libs")
set(CPACK_DEBIAN_TORCH_DESCRIPTION "ckpt libtorch adapter
libckpttorch.so.0: state dicts of torch tensors from ckptd's checkpoints.")
set(CPACK_DEBIAN_DEV_PACKAGE_NAME "libckptclient-dev")
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION "libdevel")
set(CPACK_DEBIAN_DEV_DESCRIPTION "ckpt client library: development files
Headers (<ckpt/...>), link names and the CMake package (find_package(ckpt)).")

# Maintainer scripts of ckptd, and its configuration as a conffile.
set(CKPT_SYSUSERS_FILE "${CMAKE_INSTALL_PREFIX}/${CKPT_SYSUSERS_DIR}/ckptd.conf")
set(ckpt_debian_dir "${CMAKE_CURRENT_BINARY_DIR}/debian")
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/postinst.in ${ckpt_debian_dir}/postinst @ONLY
               FILE_PERMISSIONS OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
configure_file(${CMAKE_CURRENT_LIST_DIR}/debian/conffiles.in ${ckpt_debian_dir}/conffiles @ONLY)
set(CPACK_DEBIAN_DAEMON_PACKAGE_CONTROL_EXTRA
    "${ckpt_debian_dir}/postinst;${CMAKE_CURRENT_LIST_DIR}/debian/prerm;${CMAKE_CURRENT_LIST_DIR}/debian/postrm;${ckpt_debian_dir}/conffiles")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION ON)

include(CPack)

# Installs headers, libtorch_monitor and a package config so that C++ programs
# can find_package(TorchMonitor) and link TorchMonitor::torch_monitor.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS torch_monitor EXPORT TorchMonitorTargets
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
install(DIRECTORY csrc/include/torch_monitor
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/csrc/include/torch_monitor/version.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/torch_monitor)
install(EXPORT TorchMonitorTargets
  NAMESPACE TorchMonitor::
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TorchMonitor)
configure_package_config_file(cmake/TorchMonitorConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/TorchMonitorConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TorchMonitor)
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/TorchMonitorConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/TorchMonitorConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/TorchMonitorConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TorchMonitor)
install(FILES cmake/FindTorchFromPython.cmake DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/TorchMonitor)

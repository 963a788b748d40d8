// mwms-doctor's GPU line in a CPU-only build (doctor_device.h): nothing to probe.
#include "doctor_device.h"

namespace mwms::tools {

DeviceReport probe_devices() noexcept {
  DeviceReport r;
  r.error = "not built with CUDA (-DMWMS_WITH_CUDA=OFF): host buffers only";
  return r;
}

}  // namespace mwms::tools

// Whether this process's kernel launches ask for programmatic dependent launch (kernels/dependent_launch.cuh): plain
// C++, for the host code that states it.
#pragma once

namespace inferd::kernels {

// The current device has programmatic dependent launch (compute capability 9.0 or later) and the kernels' code was
// compiled for it (the virtual architecture of the code the device runs is 9.0 or later). Code JIT-compiled from
// older PTX has WaitForPrerequisites compiled out, so a launch that let it start early would race the kernel before
// it. Decided once per process, from the probe kernel of kernels/device_code.h (built like the others).
bool DependentLaunchAllowed();

}  // namespace inferd::kernels

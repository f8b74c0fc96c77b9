// The version inferd reports (gRPC's GetServerInfo, the routers' /server_info and /v1/loads).
#pragma once

namespace inferd {

inline constexpr const char* kVersion = "0.1.0";

}  // namespace inferd

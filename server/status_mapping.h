// The one place where engine outcomes become gRPC statuses and proto enums.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "engine/request.h"
#include "inferd/v1/inferd.pb.h"

namespace inferd {

grpc::Status ToGrpcStatus(const absl::Status& status);
v1::FinishReason ToProto(FinishReason reason);

// Outcomes the service itself decides (every other status comes from the engine or request validation).
absl::Status ModelLoadingStatus();                  // UNAVAILABLE while the model loads
absl::Status WorkersFullStatus();                   // RESOURCE_EXHAUSTED when the request workers' queue is full
absl::Status CallCancelledStatus(const char* why);  // CANCELLED: the client cancelled, or went away

}  // namespace inferd

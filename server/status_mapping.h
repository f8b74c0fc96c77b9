// The one place where engine outcomes become gRPC statuses and proto enums.
#pragma once

#include <grpcpp/grpcpp.h>

#include "absl/status/status.h"
#include "engine/request.h"
#include "inferd/v1/inferd.pb.h"

namespace inferd {

grpc::Status ToGrpcStatus(const absl::Status& status);
v1::FinishReason ToProto(FinishReason reason);

}  // namespace inferd

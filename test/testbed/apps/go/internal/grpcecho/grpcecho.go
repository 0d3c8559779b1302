// Package grpcecho is a gRPC service with one bidirectional streaming method that
// sends every message back as it comes. Its messages are protobuf's well-known
// BytesValue, so no generated code is needed: the service description is written
// out here, as protoc-gen-go-grpc would write it.
package grpcecho

import (
	"errors"
	"io"

	"google.golang.org/grpc"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Method is the full name the client calls.
const Method = "/bypass.apps.Echo/Stream"

// StreamDesc describes the method to a client.
var StreamDesc = grpc.StreamDesc{StreamName: "Stream", ServerStreams: true, ClientStreams: true}

// Register adds the service to `s`.
func Register(s *grpc.Server) {
	desc := StreamDesc
	desc.Handler = stream
	s.RegisterService(&grpc.ServiceDesc{
		ServiceName: "bypass.apps.Echo",
		HandlerType: (*any)(nil),
		Streams:     []grpc.StreamDesc{desc},
		Metadata:    "bypass/apps/echo",
	}, nil)
}

func stream(_ any, s grpc.ServerStream) error {
	for {
		m := new(wrapperspb.BytesValue)
		err := s.RecvMsg(m)
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		if err := s.SendMsg(m); err != nil {
			return err
		}
	}
}

// Command grpcserver serves the bidirectional streaming echo of package grpcecho over
// plain-text HTTP/2.
package main

import (
	"flag"
	"log"

	"google.golang.org/grpc"

	"bypass.local/apps/internal/grpcecho"
	"bypass.local/apps/internal/serve"
)

func main() {
	addr := serve.Flags()
	flag.Parse()
	s := grpc.NewServer()
	grpcecho.Register(s)
	log.Fatal(s.Serve(addr.Listen()))
}

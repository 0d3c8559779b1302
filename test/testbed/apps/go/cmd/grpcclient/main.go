// Command grpcclient opens one bidirectional stream to grpcserver, sends -messages
// pattern messages (sizes cycling through -sizes) while it receives their echoes, and
// checks each echo byte for byte and the SHA-256 of the whole stream each way. One
// JSON report; exit 1 on any failure; it gives up when no byte moves either way on its
// connection for -idle, however long the whole stream takes.
package main

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/wrapperspb"

	"bypass.local/apps/internal/grpcecho"
	"bypass.local/apps/internal/idle"
	"bypass.local/apps/internal/pattern"
	"bypass.local/apps/internal/report"
	"bypass.local/apps/internal/sizes"
)

// Report is what the test reads.
type Report struct {
	Messages  int      `json:"messages"`
	Exact     int      `json:"exact"`
	BytesSent int64    `json:"bytes_sent"`
	BytesBack int64    `json:"bytes_back"`
	SHASent   string   `json:"sha256_sent"`
	SHABack   string   `json:"sha256_back"`
	Secs      float64  `json:"secs"`
	Failures  []string `json:"failures"`
}

func main() {
	connect := flag.String("connect", "", "address:port of grpcserver")
	messages := flag.Int("messages", 100, "messages on the stream")
	sizesFlag := flag.String("sizes", "1,100,10000,1048576", "message sizes in bytes, cycled")
	seed := flag.Uint64("seed", 1, "pattern seed")
	idleFor := idle.Flag()
	flag.Parse()
	msgSizes := sizes.Parse(*sizesFlag)
	message := func(i int) []byte { return pattern.Bytes(*seed, uint64(i), msgSizes[i%len(msgSizes)]) }
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	conn, err := grpc.NewClient(*connect,
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			return idle.Dial(ctx, "tcp", addr, *idleFor)
		}))
	if err != nil {
		log.Fatalf("client for %s: %v", *connect, err)
	}
	defer conn.Close()
	start := time.Now()
	stream, err := conn.NewStream(ctx, &grpcecho.StreamDesc, grpcecho.Method)
	if err != nil {
		log.Fatalf("open the stream: %v", err)
	}
	var failures report.Failures
	type sent struct {
		bytes int64
		sum   []byte
	}
	done := make(chan sent, 1)
	go func() {
		h := sha256.New()
		var n int64
		for i := range *messages {
			m := message(i)
			if err := stream.SendMsg(&wrapperspb.BytesValue{Value: m}); err != nil {
				failures.Add("send message %d: %v", i, err)
				break
			}
			h.Write(m)
			n += int64(len(m))
		}
		if err := stream.CloseSend(); err != nil {
			failures.Add("close the sending side: %v", err)
		}
		done <- sent{n, h.Sum(nil)}
	}()
	r := Report{Messages: *messages}
	h := sha256.New()
	for i := range *messages {
		m := new(wrapperspb.BytesValue)
		if err := stream.RecvMsg(m); err != nil {
			failures.Add("receive echo %d: %v", i, err)
			break
		}
		h.Write(m.Value)
		r.BytesBack += int64(len(m.Value))
		if want := message(i); !bytes.Equal(m.Value, want) {
			failures.Add("echo %d: %d bytes differ from the %d sent", i, len(m.Value), len(want))
			continue
		}
		r.Exact++
	}
	if r.Exact == *messages {
		if err := stream.RecvMsg(new(wrapperspb.BytesValue)); !errors.Is(err, io.EOF) {
			failures.Add("after the last echo: %v, want the end of the stream", err)
		}
	}
	s := <-done
	r.BytesSent, r.SHASent, r.SHABack = s.bytes, fmt.Sprintf("%x", s.sum), fmt.Sprintf("%x", h.Sum(nil))
	if r.SHASent != r.SHABack {
		failures.Add("the stream's SHA-256 back %s differs from the one sent %s", r.SHABack, r.SHASent)
	}
	r.Secs = time.Since(start).Seconds()
	r.Failures = failures.List()
	report.Print(r, len(r.Failures) > 0)
}

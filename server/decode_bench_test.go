package server

import (
	"net/http"
	"testing"
	"time"
)

// BenchmarkDecode measures what every acquire and release request costs
// the server before its lock call: the Content-Type check and the strict
// decoding of the body, for the bodies the Go client sends.
func BenchmarkDecode(b *testing.B) {
	l := limits{minTTL: time.Millisecond, maxTTL: time.Hour, defaultTTL: 15 * time.Second, maxWait: time.Hour}
	h := http.Header{"Content-Type": {"application/json"}}
	for _, c := range []struct {
		name   string
		decode func() *apiError
	}{
		{"acquire", func() *apiError { _, aerr := l.decodeAcquire([]byte(`{"ttl_ms":5000}`)); return aerr }},
		{"release", func() *apiError {
			_, aerr := l.decodeRelease([]byte(`{"lease_id":"0123456789abcdef0123456789abcdef"}`))
			return aerr
		}},
	} {
		b.Run(c.name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if aerr := checkContentType(h); aerr != nil {
					b.Fatal(aerr.message)
				}
				if aerr := c.decode(); aerr != nil {
					b.Fatal(aerr.message)
				}
			}
		})
	}
}

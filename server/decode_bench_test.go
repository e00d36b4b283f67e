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
	b.Run("acquire", func(b *testing.B) {
		body := []byte(`{"ttl_ms":5000}`)
		b.ReportAllocs()
		for b.Loop() {
			if checkContentType(h) != nil {
				b.Fatal("refused")
			}
			if _, aerr := l.decodeAcquire(body); aerr != nil {
				b.Fatal(aerr.message)
			}
		}
	})
	b.Run("release", func(b *testing.B) {
		body := []byte(`{"lease_id":"0123456789abcdef0123456789abcdef"}`)
		b.ReportAllocs()
		for b.Loop() {
			if checkContentType(h) != nil {
				b.Fatal("refused")
			}
			if _, aerr := l.decodeRelease(body); aerr != nil {
				b.Fatal(aerr.message)
			}
		}
	})
}

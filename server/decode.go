package server

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/fenced/fenced/api"
	"github.com/fenced/fenced/lock"
)

// Request bodies, after decoding and validation.

type acquireRequest struct {
	ttl           time.Duration
	wait          time.Duration
	owner, holder string
	unfair        bool
	waiter        string // the acquisition across requests, and a fair one's place; "" for none
	final         bool   // the waiter's last request: its place goes with it
}

type refreshRequest struct {
	leaseID string
	ttl     time.Duration
	seq     uint64 // 0: none given
}

type releaseRequest struct {
	leaseID, releaseID string
}

// The fields of each request body: the JSON fields of package api's
// request types, which the OpenAPI test checks against the document.
var (
	acquireFields  = jsonFields(api.AcquireRequest{})
	refreshFields  = jsonFields(api.RefreshRequest{})
	releaseFields  = jsonFields(api.ReleaseRequest{})
	campaignFields = jsonFields(api.CampaignRequest{})
)

// jsonFields lists the JSON names of a struct's fields.
func jsonFields(v any) []string {
	t := reflect.TypeOf(v)
	var f []string
	for i := 0; i < t.NumField(); i++ {
		f = append(f, strings.Split(t.Field(i).Tag.Get("json"), ",")[0])
	}
	return f
}

// limits are what a request may ask for.
type limits struct {
	minTTL, maxTTL, defaultTTL, maxWait time.Duration
}

func (l limits) decodeAcquire(body []byte) (acquireRequest, *apiError) {
	fields, aerr := decodeObject(body, acquireFields...)
	if aerr != nil {
		return acquireRequest{}, aerr
	}
	req, aerr := l.ttlAndWait(fields)
	if aerr != nil {
		return acquireRequest{}, aerr
	}
	if req.owner, aerr = label(fields, fieldOwner); aerr != nil {
		return acquireRequest{}, aerr
	}
	if req.holder, aerr = label(fields, fieldHolder); aerr != nil {
		return acquireRequest{}, aerr
	}
	if req.unfair, aerr = boolField(fields, fieldUnfair); aerr != nil {
		return acquireRequest{}, aerr
	}
	if req.unfair && req.wait == 0 {
		return acquireRequest{}, invalid(fieldUnfair, "unfair applies to a waiting acquire (wait_ms > 0): one attempt always takes a free lock, whoever waits")
	}
	if req.waiter, aerr = waiter(fields); aerr != nil {
		return acquireRequest{}, aerr
	}
	if req.final, aerr = final(fields, req); aerr != nil {
		return acquireRequest{}, aerr
	}
	return req, nil
}

// boolField reads an optional true or false; false when absent.
func boolField(fields map[string]json.RawMessage, field string) (bool, *apiError) {
	raw, ok := fields[field]
	if !ok {
		return false, nil
	}
	var v bool
	if err := json.Unmarshal(raw, &v); err != nil || len(raw) == 0 || raw[0] == 'n' {
		return false, invalid(field, fmt.Sprintf("%s: want true or false, got %s", field, excerpt(raw)))
	}
	return v, nil
}

// final reads the optional final flag, which applies with a waiter.
func final(fields map[string]json.RawMessage, req acquireRequest) (bool, *apiError) {
	v, aerr := boolField(fields, fieldFinal)
	if aerr != nil {
		return false, aerr
	}
	switch {
	case v && req.waiter == "":
		return false, invalid(fieldFinal, "final applies with a waiter: a request without one has a place of its own, given up when it ends")
	case v && (req.wait == 0 || req.unfair):
		return false, invalid(fieldFinal, "final applies to a fair waiting request (wait_ms > 0, not unfair): one attempt or an unfair acquire has no place in the queue to give up")
	}
	return v, nil
}

// waiter returns the optional waiter of an acquire or campaign, checked
// by lock.ValidateWaiter; "" when it is absent. It names the acquisition,
// so that a request sent again after a lost answer gets its grant; a
// waiting, fair one's is also its place in the queue.
func waiter(fields map[string]json.RawMessage) (string, *apiError) {
	v, ok, aerr := stringField(fields, fieldWaiter, "a string of 32 lowercase hex digits")
	if !ok || aerr != nil {
		return "", aerr
	}
	if err := lock.ValidateWaiter(v); err != nil {
		return "", invalid(fieldWaiter, fmt.Sprintf("waiter: %v", err))
	}
	return v, nil
}

// decodeCampaign reads a campaign: an acquire whose owner is the
// leader's value.
func (l limits) decodeCampaign(body []byte) (acquireRequest, *apiError) {
	fields, aerr := decodeObject(body, campaignFields...)
	if aerr != nil {
		return acquireRequest{}, aerr
	}
	req, aerr := l.ttlAndWait(fields)
	if aerr != nil {
		return acquireRequest{}, aerr
	}
	if req.owner, aerr = label(fields, fieldValue); aerr != nil {
		return acquireRequest{}, aerr
	}
	if req.waiter, aerr = waiter(fields); aerr != nil {
		return acquireRequest{}, aerr
	}
	if req.final, aerr = final(fields, req); aerr != nil {
		return acquireRequest{}, aerr
	}
	return req, nil
}

// ttlAndWait reads the optional ttl_ms and wait_ms of an acquire or a
// campaign.
func (l limits) ttlAndWait(fields map[string]json.RawMessage) (acquireRequest, *apiError) {
	req := acquireRequest{ttl: l.defaultTTL}
	var aerr *apiError
	if raw, ok := fields["ttl_ms"]; ok {
		if req.ttl, aerr = l.ttl(raw); aerr != nil {
			return acquireRequest{}, aerr
		}
	}
	if raw, ok := fields["wait_ms"]; ok {
		if req.wait, aerr = l.wait(raw); aerr != nil {
			return acquireRequest{}, aerr
		}
	}
	return req, nil
}

// wait checks a wait_ms: 0 (one attempt) to the server's --max-wait. One
// out of that range, beyond int64 included, carries max_wait_ms, on which
// clients split a long wait (docs/design.md, defect 124).
func (l limits) wait(raw json.RawMessage) (time.Duration, *apiError) {
	ms, aerr := integer(fieldWaitMs, raw)
	if aerr != nil {
		return 0, aerr
	}
	if ms < 0 || ms > l.maxWait.Milliseconds() {
		aerr := invalid(fieldWaitMs, fmt.Sprintf("wait_ms %s: want 0 to %d (milliseconds; 0: no wait)", excerpt(raw), l.maxWait.Milliseconds()))
		aerr.maxWait = l.maxWait // a client may ask for that instead
		return 0, aerr
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// stringField returns the optional JSON string field; ok is false when
// it is absent. want says what is allowed, for the error.
func stringField(fields map[string]json.RawMessage, field, want string) (v string, ok bool, aerr *apiError) {
	raw, ok := fields[field]
	if !ok {
		return "", false, nil
	}
	if len(raw) == 0 || raw[0] != '"' || json.Unmarshal(raw, &v) != nil {
		return "", true, invalid(field, fmt.Sprintf("%s: want %s, got %s", field, want, excerpt(raw)))
	}
	if replaced(raw, v) {
		return "", true, invalid(field, fmt.Sprintf("%s: not UTF-8 text (an invalid byte, or a \\u escape of half a surrogate pair); want %s", field, want))
	}
	return v, true, nil
}

// replaced reports whether decoding raw into v replaced something with
// U+FFFD: encoding/json does so silently for invalid UTF-8 and for unpaired
// surrogate escapes, and two holders that differ only there would become
// one (a holder is a credential).
func replaced(raw json.RawMessage, v string) bool {
	if !strings.ContainsRune(v, utf8.RuneError) {
		return false
	}
	if !utf8.Valid(raw) {
		return true
	}
	// Valid UTF-8 that decodes to U+FFFD: it was sent as itself, or as
	// \ufffd, or it stands for an unpaired surrogate escape.
	n := strings.Count(v, string(utf8.RuneError))
	sent := strings.Count(string(raw), string(utf8.RuneError)) + strings.Count(strings.ToLower(string(raw)), `\ufffd`)
	return n != sent
}

// label returns the optional string field (owner or holder), checked by
// lock.ValidateLabel; "" when it is absent.
func label(fields map[string]json.RawMessage, field string) (string, *apiError) {
	v, ok, aerr := stringField(fields, field, "a string")
	if !ok || aerr != nil {
		return "", aerr
	}
	if err := lock.ValidateLabel(v); err != nil {
		return "", invalid(field, fmt.Sprintf("%s: %v", field, err))
	}
	return v, nil
}

func (l limits) decodeRefresh(body []byte) (refreshRequest, *apiError) {
	fields, aerr := decodeObject(body, refreshFields...)
	if aerr != nil {
		return refreshRequest{}, aerr
	}
	req := refreshRequest{ttl: l.defaultTTL}
	if req.leaseID, aerr = leaseID(fields); aerr != nil {
		return refreshRequest{}, aerr
	}
	if raw, ok := fields["ttl_ms"]; ok {
		if req.ttl, aerr = l.ttl(raw); aerr != nil {
			return refreshRequest{}, aerr
		}
	}
	if raw, ok := fields[fieldSeq]; ok {
		if req.seq, aerr = seq(raw); aerr != nil {
			return refreshRequest{}, aerr
		}
	}
	return req, nil
}

// seq checks a refresh's sequence number: an integer from 1 to api.MaxSeq.
func seq(raw json.RawMessage) (uint64, *apiError) {
	const want = "want an integer from 1 to 9007199254740991 (2^53-1), higher with each refresh of the lease, or no seq for an unordered refresh"
	n, err := strconv.ParseUint(string(raw), 10, 64)
	if err != nil || n < 1 || n > api.MaxSeq {
		return 0, invalid(fieldSeq, fmt.Sprintf("seq %s: %s", excerpt(raw), want))
	}
	return n, nil
}

func (l limits) decodeRelease(body []byte) (releaseRequest, *apiError) {
	fields, aerr := decodeObject(body, releaseFields...)
	if aerr != nil {
		return releaseRequest{}, aerr
	}
	id, aerr := leaseID(fields)
	if aerr != nil {
		return releaseRequest{}, aerr
	}
	op, ok, aerr := stringField(fields, fieldReleaseID, "a string of 32 lowercase hex digits")
	if aerr != nil {
		return releaseRequest{}, aerr
	}
	if ok {
		if err := lock.ValidateReleaseID(op); err != nil {
			return releaseRequest{}, invalid(fieldReleaseID, fmt.Sprintf("%v; draw one per release (128 random bits) and send it again with each retry", err))
		}
	}
	return releaseRequest{leaseID: id, releaseID: op}, nil
}

func (l limits) ttl(raw json.RawMessage) (time.Duration, *apiError) {
	lo, hi := l.minTTL.Milliseconds(), l.maxTTL.Milliseconds()
	ms, aerr := integer(fieldTTLMs, raw)
	if aerr != nil {
		return 0, aerr
	}
	if ms < lo || ms > hi {
		return 0, invalid(fieldTTLMs, fmt.Sprintf("ttl_ms %s: want %d to %d (milliseconds)", excerpt(raw), lo, hi))
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// leaseID returns the required lease_id. Its form (32 lowercase hex digits) is
// checked by package lock before any key is touched.
func leaseID(fields map[string]json.RawMessage) (string, *apiError) {
	raw, ok := fields["lease_id"]
	if !ok {
		return "", invalid(fieldLeaseID, `lease_id is missing: send {"lease_id":"…"} with the lease id that acquire returned`)
	}
	if len(raw) == 0 || raw[0] != '"' {
		return "", invalid(fieldLeaseID, fmt.Sprintf("lease_id: want a string, got %s", excerpt(raw)))
	}
	var id string
	if err := json.Unmarshal(raw, &id); err != nil {
		return "", invalid(fieldLeaseID, fmt.Sprintf("lease_id: want a string, got %s", excerpt(raw)))
	}
	if id == "" {
		return "", invalid(fieldLeaseID, "lease_id is empty: want the 32 lowercase hex digits that acquire returned")
	}
	return id, nil
}

// integer decodes a JSON integer: no fraction, no exponent, no quotes, no
// null. One beyond int64 is math.MaxInt64 or math.MinInt64, which the
// caller's range check refuses as it refuses any number out of its range:
// refused here, a wait_ms beyond int64 lost the max_wait_ms of that
// refusal (docs/design.md, defect 124).
func integer(field string, raw json.RawMessage) (int64, *apiError) {
	// A query's value is not JSON: "100abc" or "007" reach here as they
	// are. Only digits, after an optional minus, are an integer; then
	// ParseInt fails only out of range, and returns the bound it passed.
	digits := bytes.TrimPrefix(raw, []byte("-"))
	if len(digits) == 0 || bytes.ContainsFunc(digits, func(r rune) bool { return r < '0' || r > '9' }) {
		return 0, invalid(field, fmt.Sprintf("%s: want an integer number of milliseconds, got %s", field, excerpt(raw)))
	}
	n, err := strconv.ParseInt(string(raw), 10, 64)
	if err != nil && !errors.Is(err, strconv.ErrRange) {
		return 0, invalid(field, fmt.Sprintf("%s: want an integer number of milliseconds, got %s", field, excerpt(raw)))
	}
	return n, nil
}

// decodeObject decodes body as one JSON object whose keys are among
// allowed, spelled exactly, each at most once, with nothing after it. An
// empty body (or only white space) is an empty object.
func decodeObject(body []byte, allowed ...string) (map[string]json.RawMessage, *apiError) {
	fields := make(map[string]json.RawMessage, len(allowed))
	if len(bytes.TrimSpace(body)) == 0 {
		return fields, nil
	}
	// Built only for a refusal: every request passes here.
	want := func() string { return "a JSON object with " + strings.Join(quoteAll(allowed), ", ") }
	dec := json.NewDecoder(bytes.NewReader(body))
	tok, err := dec.Token()
	if err != nil {
		return nil, invalid("", fmt.Sprintf("request body is not valid JSON (%v); want %s", err, want()))
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, invalid("", "request body: want "+want())
	}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, invalid("", fmt.Sprintf("request body is not valid JSON (%v)", err))
		}
		key, ok := tok.(string)
		if !ok { // the decoder only returns strings here, but be sure
			return nil, invalid("", "request body: want an object key")
		}
		if !slices.Contains(allowed, key) {
			return nil, invalid("", fmt.Sprintf("request body: unknown field %s; allowed are %s", excerpt([]byte(fmt.Sprintf("%q", key))), strings.Join(quoteAll(allowed), ", ")))
		}
		if _, dup := fields[key]; dup {
			return nil, invalid("", fmt.Sprintf("request body: field %q appears twice", key))
		}
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, invalid("", fmt.Sprintf("request body is not valid JSON (%v)", err))
		}
		fields[key] = raw
	}
	if tok, err := dec.Token(); err != nil || tok != json.Delim('}') {
		return nil, invalid("", "request body is not valid JSON: the object does not end")
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return nil, invalid("", "request body: trailing data after the JSON object; send exactly one object")
	}
	return fields, nil
}

// checkContentType accepts a missing Content-Type or application/json
// (with charset utf-8 if a charset is given).
func checkContentType(h http.Header) *apiError {
	ct := h.Values("Content-Type")
	if len(ct) == 0 {
		return nil
	}
	// Built only for a refusal: every request passes here.
	unsupported := func() *apiError {
		return &apiError{status: http.StatusUnsupportedMediaType, code: codeUnsupportedMediaType,
			message: fmt.Sprintf("Content-Type %s: want application/json (or none; curl -d's form type is read as JSON too)", excerpt([]byte(fmt.Sprintf("%q", strings.Join(ct, ", ")))))}
	}
	if len(ct) > 1 {
		return unsupported()
	}
	mt, params, err := mime.ParseMediaType(ct[0])
	if err == nil && mt == "application/x-www-form-urlencoded" && len(params) == 0 {
		// What curl -d sends by default: the body is still parsed as JSON,
		// so `curl -d '{"ttl_ms":5000}'` works as a reader would expect.
		return nil
	}
	if err != nil || mt != "application/json" {
		return unsupported()
	}
	for k, v := range params {
		if k != "charset" || !strings.EqualFold(v, "utf-8") {
			return unsupported()
		}
	}
	return nil
}

// excerpt shows at most 40 bytes of b in an error message: as they are
// when they are printable ASCII, else quoted.
func excerpt(b []byte) string {
	const max = 40
	if len(b) == 0 {
		return "nothing"
	}
	more := ""
	if len(b) > max {
		b, more = b[:max], "…"
	}
	for _, c := range b {
		if c < 0x20 || c > 0x7e {
			return fmt.Sprintf("%q%s", b, more)
		}
	}
	return string(b) + more
}

func quoteAll(ss []string) []string {
	q := make([]string, len(ss))
	for i, s := range ss {
		q[i] = `"` + s + `"`
	}
	return q
}

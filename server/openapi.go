package server

import (
	"io"
	"net/http"
	"strconv"

	"github.com/fenced/fenced/api"
)

// serveOpenAPI serves api/openapi.yaml, the document of this API. It is
// open, like the probes: it holds no secret, and a client or a code
// generator may need it before it has a token.
func (s *Server) serveOpenAPI(w http.ResponseWriter, r *http.Request, _ string) {
	spec := api.Spec()
	h := w.Header()
	h.Set("Content-Type", "application/yaml")
	h.Set("Content-Length", strconv.Itoa(len(spec)))
	h.Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(http.StatusOK)
	if r.Method != http.MethodHead {
		io.WriteString(w, spec)
	}
}

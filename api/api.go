// Package api holds the OpenAPI document of fenced's v1 HTTP API,
// openapi.yaml in this directory. Package server serves it at
// GET /v1/openapi.yaml, and its tests check every response against it.
package api

import _ "embed"

//go:embed openapi.yaml
var spec string

// Spec returns the OpenAPI 3.0 document of the v1 API, in YAML.
func Spec() string { return spec }

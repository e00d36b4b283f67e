// Package api is fenced's v1 HTTP API: its OpenAPI document (openapi.yaml
// in this directory, [Spec]) and its wire types, the request, answer and
// error bodies with the error codes. Package server serves the document at
// GET /v1/openapi.yaml and writes these types; package client reads them.
// The server's tests check every response, and these types' fields,
// against the document.
package api

import _ "embed"

//go:embed openapi.yaml
var spec string

// Spec returns the OpenAPI 3.0 document of the v1 API, in YAML.
func Spec() string { return spec }

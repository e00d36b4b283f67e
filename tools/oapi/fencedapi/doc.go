// Package fencedapi is a Go client of fenced's HTTP API generated from
// api/openapi.yaml by oapi-codegen, as any OpenAPI user would generate one.
// It lives in its own module so that the main module does not depend on
// oapi-codegen; its tests regenerate it to check that the committed code
// matches the document, and take it on the tour of a real server.
//
// Go users of fenced want package client of the main module instead: its
// leases keep themselves alive.
package fencedapi

//go:generate go tool oapi-codegen -config oapi-codegen.yaml -o fencedapi.gen.go ../../../api/openapi.yaml

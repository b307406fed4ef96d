//go:build tools

// Package tools pins the Jaeger all-in-one this module builds.
package tools

import (
	_ "github.com/jaegertracing/jaeger/cmd/jaeger"
)

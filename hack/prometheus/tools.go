//go:build tools

// Package tools pins the Prometheus server and promtool this module builds.
package tools

import (
	_ "github.com/prometheus/prometheus/cmd/prometheus"
	_ "github.com/prometheus/prometheus/cmd/promtool"
)

//go:build tools

// Package tools pins the control-plane commands this module builds.
package tools

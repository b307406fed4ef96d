//go:build tools

// Package tools pins the kro controller this module builds.
package tools

import (
	_ "github.com/kubernetes-sigs/kro/cmd/controller"
)

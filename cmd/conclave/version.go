package main

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// version is set at release builds with -ldflags "-X main.version=v1.2.3".
var version = ""

func versionString() string {
	v, rev := version, ""
	if info, ok := debug.ReadBuildInfo(); ok {
		if v == "" {
			v = info.Main.Version
		}
		for _, s := range info.Settings {
			if s.Key == "vcs.revision" {
				rev = s.Value
			}
		}
	}
	if v == "" || v == "(devel)" {
		v = "dev"
	}
	out := fmt.Sprintf("conclave %s %s %s/%s", v, runtime.Version(), runtime.GOOS, runtime.GOARCH)
	if rev != "" {
		out += " " + rev
	}
	return out
}

// Package config holds the Librarian's default agents.yaml and
// protocol.yaml, compiled into the binary so that a Lambda needs no other
// file; CONCLAVE_LIBRARIAN_CONFIG_DIR replaces them with a directory's.
package config

import "embed"

// Files are agents.yaml and protocol.yaml.
//
//go:embed agents.yaml protocol.yaml
var Files embed.FS

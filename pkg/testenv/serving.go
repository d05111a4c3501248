package testenv

import "encoding/json"

// ServingGRPCAddr reads a deployable's JSON log line and returns the gRPC
// address it announces in its "serving" entry (pkg/server logs one once its
// listeners are bound), or "" for any other line. Tests that start a
// deployable on port 0 learn its real address this way, so that no other
// process can take a port picked in advance.
func ServingGRPCAddr(line []byte) string {
	var entry struct {
		Msg      string `json:"msg"`
		GRPCAddr string `json:"grpc_addr"`
	}
	if json.Unmarshal(line, &entry) != nil || entry.Msg != "serving" {
		return ""
	}
	return entry.GRPCAddr
}

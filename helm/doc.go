// Package helm holds no code: its tests check the deployment artefacts
// (helm/conclave, skaffold.yaml and the services' Dockerfiles) against each
// other and against the services' code. It is a module outside go.work
// (GOWORK=off, the Makefile's STANDALONE list) because k8s.io/api and
// k8s.io/apimachinery would otherwise join the services' build list.
package helm

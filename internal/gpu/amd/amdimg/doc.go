// Package amdimg reads and writes the image files of AMD's CRIU plugin (amdgpu_plugin.so)
// and summarizes them for `gpucr inspect`, so gpucr can show and check an AMD checkpoint
// without the plugin.
//
// Files: amdgpu-kfd-<id>.img holds a criu_kfd message (one process's /dev/kfd state) and
// amdgpu-renderD-<id>.img a criu_render_node message, where <id> is the id CRIU gives the
// open file: the plugin names both files after that id, not after the render minor (the
// minor is in the kfd image's device entries).
//
// Framing: the plugin writes its images through its own helper (write_img_file), not
// CRIU's pb_write_one, so there is no CRIU magic and no 4-byte entry size. Each file is the
// length of the message as a size_t, then the serialized message. The plugin stores that
// length so that it can read its images back from criu-image-streamer, where fstat and
// fseek do not work (the manpage lists the streamer as supported). A size_t is 8 bytes on
// every 64-bit Linux ROCm runs on, all of them little-endian, so this package reads and
// writes an 8-byte little-endian length. VRAM contents (amdgpu-pages-*.img) are raw bytes
// and are not read here.
//
// amdgpu.pb.go is generated from amdgpu.proto; after changing the .proto, regenerate it
// from this directory with protoc-gen-go v1.34.2 (the protobuf version in go.mod):
//
//	go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.34.2
//	protoc --go_out=. --go_opt=paths=source_relative amdgpu.proto
package amdimg

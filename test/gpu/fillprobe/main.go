// Command fillprobe measures, on the GPU machine, the ways a restore can write an image's
// memory into another process's fresh memory (the fill), and a checkpoint can read it out
// (the save): what bounds them, apart from gpucr's code. Results and the conclusions drawn
// are in docs/benchmarks.md. Build it here (CGO_ENABLED=0 go build ./test/gpu/fillprobe)
// and run it there: `./fillprobe -gib 16 -workers 16` (fill), `./fillprobe -save` (save).
package main

import (
	"bufio"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

const step = 1 << 20

var (
	sizeGiB  = flag.Int("gib", 16, "GiB")
	workers  = flag.Int("workers", 16, "workers")
	src      = flag.String("src", "/dev/shm/fillprobe.src", "source file")
	saveMode = flag.Bool("save", false, "probe the save")
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "child" {
		child()
		return
	}
	flag.Parse()
	size := int64(*sizeGiB) << 30
	if *saveMode {
		saveProbe(size)
		return
	}
	makeSource(size)
	for _, v := range []string{"pread+pvw", "mmap+pvw", "prefault+pread+pvw", "uffd-copy", "pread+pvw", "uffd-copy", "mmap+pvw"} {
		run(v, size)
	}
	os.Remove(*src)
}

func makeSource(size int64) {
	t := time.Now()
	f, err := os.OpenFile(*src, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	check(err)
	check(f.Truncate(size))
	var wg sync.WaitGroup
	per := size / int64(*workers)
	for w := 0; w < *workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			buf := make([]byte, step)
			for off := int64(w) * per; off < int64(w+1)*per; off += step {
				for i := 0; i < len(buf); i += 8 {
					*(*uint64)(unsafe.Pointer(&buf[i])) = uint64(off+int64(i))*0x9E3779B97F4A7C15 + 1
				}
				_, err := f.WriteAt(buf, off)
				check(err)
			}
		}(w)
	}
	wg.Wait()
	f.Close()
	fmt.Printf("source %d GiB written in %.2fs\n", size>>30, time.Since(t).Seconds())
}

type kid struct {
	cmd  *exec.Cmd
	in   *os.File
	out  *bufio.Reader
	addr uint64
}

// startKid starts the child process that holds size bytes of fresh memory, and asks where.
func startKid(size int64) *kid {
	pr, pw, _ := os.Pipe()
	cr, cw, _ := os.Pipe()
	cmd := exec.Command("/proc/self/exe", "child", strconv.FormatInt(size, 10))
	cmd.Stdin, cmd.Stdout, cmd.Stderr = pr, cw, os.Stderr
	check(cmd.Start())
	pr.Close()
	cw.Close()
	k := &kid{cmd: cmd, in: pw, out: bufio.NewReader(cr)}
	k.addr, _ = strconv.ParseUint(k.ask("addr"), 0, 64)
	return k
}

func (k *kid) ask(q string) string {
	fmt.Fprintln(k.in, q)
	s, err := k.out.ReadString('\n')
	check(err)
	return strings.TrimSpace(s)
}

func run(v string, size int64) {
	k := startKid(size)
	cmd := k.cmd
	var pre string
	if v == "prefault+pread+pvw" {
		t := time.Now()
		k.ask("prefault")
		pre = fmt.Sprintf(" (prefault %.2fs)", time.Since(t).Seconds())
	}
	ufd := -1
	if v == "uffd-copy" {
		k.ask("uffd")
		pidfd, err := unix.PidfdOpen(cmd.Process.Pid, 0)
		check(err)
		n, _ := strconv.Atoi(k.ask("uffdfd"))
		ufd, err = unix.PidfdGetfd(pidfd, n, 0)
		check(err)
	}
	f, err := os.Open(*src)
	check(err)
	var m []byte
	if v == "mmap+pvw" || v == "uffd-copy" {
		m, err = unix.Mmap(int(f.Fd()), 0, int(size), unix.PROT_READ, unix.MAP_SHARED)
		check(err)
	}
	pid := cmd.Process.Pid
	t := time.Now()
	eachStep(size, func(off int64, buf []byte) {
		var part []byte
		switch v {
		case "mmap+pvw", "uffd-copy":
			part = m[off : off+step]
		default:
			_, err := f.ReadAt(buf, off)
			check(err)
			part = buf
		}
		if v == "uffd-copy" {
			c := struct {
				dst, src, len, mode uint64
				copy                int64
			}{k.addr + uint64(off), uint64(uintptr(unsafe.Pointer(&part[0]))), step, 0, 0}
			_, _, e := unix.Syscall(unix.SYS_IOCTL, uintptr(ufd), 0xc028aa03, uintptr(unsafe.Pointer(&c)))
			if e != 0 || c.copy != step {
				panic(fmt.Sprintf("uffdio_copy: %v %d", e, c.copy))
			}
			return
		}
		local := []unix.Iovec{{Base: &part[0]}}
		local[0].SetLen(step)
		remote := []unix.RemoteIovec{{Base: uintptr(k.addr + uint64(off)), Len: step}}
		n, err := unix.ProcessVMWritev(pid, local, remote, 0)
		if err != nil || n != step {
			panic(fmt.Sprint("pvw ", n, err))
		}
	})
	el := time.Since(t).Seconds()
	if ufd >= 0 {
		unix.Close(ufd)
	}
	if m != nil {
		check(unix.Munmap(m))
	}
	f.Close()
	huge := k.ask("thp")
	rt := time.Now()
	sum := k.ask("read")
	r1 := time.Since(rt).Seconds()
	fmt.Printf("%-20s %.3fs %5.1f GB/s%s | target AnonHugePages %s | one-thread read %.2fs (%.1f GB/s) sum %s\n", v, el, float64(size)/el/1e9, pre, huge, r1, float64(size)/r1/1e9, sum)
	k.ask("exit")
	check(cmd.Wait())
}

func child() {
	size, _ := strconv.ParseInt(os.Args[2], 10, 64)
	// 2 MiB aligned region
	raw, err := unix.Mmap(-1, 0, int(size)+(2<<20), unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS|unix.MAP_NORESERVE)
	check(err)
	base := uintptr(unsafe.Pointer(&raw[0]))
	skip := (2<<20 - base%(2<<20)) % (2 << 20) // huge-page aligned, as the driver's staging is
	mem := raw[skip : skip+uintptr(size)]
	al := base + skip
	check(unix.Madvise(mem, unix.MADV_HUGEPAGE))
	in := bufio.NewScanner(os.Stdin)
	var uffd int
	for in.Scan() {
		switch in.Text() {
		case "addr":
			fmt.Printf("%#x\n", al)
		case "prefault":
			var wg sync.WaitGroup
			per := size / 16
			for w := int64(0); w < 16; w++ {
				wg.Add(1)
				go func(w int64) { defer wg.Done(); check(unix.Madvise(mem[w*per:(w+1)*per], 23 /*MADV_POPULATE_WRITE*/)) }(w)
			}
			wg.Wait()
			fmt.Println("ok")
		case "uffd":
			fd, _, e := unix.Syscall(unix.SYS_USERFAULTFD, unix.O_CLOEXEC, 0, 0)
			if e != 0 {
				panic(e)
			}
			uffd = int(fd)
			api := struct{ api, features, ioctls uint64 }{0xAA, 0, 0}
			_, _, e = unix.Syscall(unix.SYS_IOCTL, fd, 0xc018aa3f, uintptr(unsafe.Pointer(&api)))
			if e != 0 {
				panic(e)
			}
			reg := struct{ start, len, mode, ioctls uint64 }{uint64(al), uint64(size), 1, 0}
			_, _, e = unix.Syscall(unix.SYS_IOCTL, fd, 0xc020aa00, uintptr(unsafe.Pointer(&reg)))
			if e != 0 {
				panic(e)
			}
			fmt.Println("ok")
		case "uffdfd":
			fmt.Println(uffd)
		case "thp":
			b, _ := os.ReadFile("/proc/self/smaps_rollup")
			v := "?"
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "AnonHugePages:") {
					v = strings.Join(strings.Fields(l)[1:], "")
				}
			}
			fmt.Println(v)
		case "read":
			var s uint64
			for i := int64(0); i < size; i += 8 {
				s += *(*uint64)(unsafe.Pointer(&mem[i]))
			}
			fmt.Printf("%x\n", s)
		case "pattern":
			var wg sync.WaitGroup
			per := size / 16
			for w := int64(0); w < 16; w++ {
				wg.Add(1)
				go func(w int64) {
					defer wg.Done()
					for i := w * per; i < (w+1)*per; i += 8 {
						*(*uint64)(unsafe.Pointer(&mem[i])) = uint64(i)*0x9E3779B97F4A7C15 + 1
					}
				}(w)
			}
			wg.Wait()
			fmt.Println("ok")
		case "exit":
			fmt.Println("bye")
			return
		}
	}
}

func check(err error) {
	if err != nil {
		panic(err)
	}
}

const seg = 256 << 20

func saveProbe(size int64) {
	k := startKid(size)
	cmd := k.cmd
	k.ask("pattern")
	pid := cmd.Process.Pid
	for _, v := range []string{"buf+pwrite", "mmap-populated", "buf+pwrite", "mmap-populated", "mmap-unpopulated"} {
		dir, _ := os.MkdirTemp("/dev/shm", "saveprobe")
		n := int(size / seg)
		files := make([]*os.File, n)
		maps := make([][]byte, n)
		t := time.Now()
		var wg sync.WaitGroup
		for i := range files {
			f, err := os.Create(fmt.Sprintf("%s/f%d", dir, i))
			check(err)
			files[i] = f
		}
		for w := 0; w < 8; w++ {
			wg.Add(1)
			go func(w int) {
				defer wg.Done()
				for i := w; i < n; i += 8 {
					check(unix.Fallocate(int(files[i].Fd()), 0, 0, seg))
					if v != "buf+pwrite" {
						m, err := unix.Mmap(int(files[i].Fd()), 0, seg, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_SHARED)
						check(err)
						maps[i] = m
						if v == "mmap-populated" {
							check(unix.Madvise(m, 23))
						}
					}
				}
			}(w)
		}
		wg.Wait()
		prep := time.Since(t).Seconds()
		t = time.Now()
		eachStep(size, func(off int64, buf []byte) {
			fi, fo := off/seg, off%seg
			part := buf
			if v != "buf+pwrite" {
				part = maps[fi][fo : fo+step]
			}
			local := []unix.Iovec{{Base: &part[0]}}
			local[0].SetLen(step)
			remote := []unix.RemoteIovec{{Base: uintptr(k.addr + uint64(off)), Len: step}}
			got, err := unix.ProcessVMReadv(pid, local, remote, 0)
			if err != nil || got != step {
				panic(fmt.Sprint("pvr ", got, err))
			}
			var x uint64
			for i := 0; i < step; i += 4096 {
				x += uint64(part[i])
			}
			_ = x
			if v == "buf+pwrite" {
				_, err := files[fi].WriteAt(part, fo)
				check(err)
			}
		})
		el := time.Since(t).Seconds()
		for i := range files {
			if maps[i] != nil {
				check(unix.Munmap(maps[i]))
			}
			check(files[i].Close())
		}
		fmt.Printf("save %-18s %.3fs %5.1f GB/s (prep %.2fs)\n", v, el, float64(size)/el/1e9, prep)
		os.RemoveAll(dir)
	}
	k.ask("exit")
	check(cmd.Wait())
}

// eachStep calls use for every step of size bytes, on -workers goroutines taking the next
// step as they are done, each with a step's buffer of its own.
func eachStep(size int64, use func(off int64, buf []byte)) {
	var next atomic.Int64
	var wg sync.WaitGroup
	for range *workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			buf := make([]byte, step)
			for off := next.Add(step) - step; off < size; off = next.Add(step) - step {
				use(off, buf)
			}
		}()
	}
	wg.Wait()
}

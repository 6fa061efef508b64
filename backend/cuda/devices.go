package cuda

import (
	"bytes"
	"fmt"
	"runtime"
)

// Device describes one CUDA device.
type Device struct {
	Index        int
	Name         string
	Major, Minor int // compute capability
	SMs          int // multiprocessors
	TotalBytes   uint64
	FreeBytes    uint64
	L2Bytes      int
	Driver       string // the CUDA version the driver supports, "13.0"
}

// Devices lists the CUDA devices, or says why there are none usable (no
// driver library, a driver too old, no device).
func Devices() ([]Device, error) {
	d, err := loadDriver()
	if err != nil {
		return nil, err
	}
	var count int32
	if r := d.cuDeviceGetCount(&count); r != 0 {
		return nil, fmt.Errorf("cuda: cuDeviceGetCount: %w", d.err(r))
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	var out []Device
	for i := range int(count) {
		dev, err := deviceInfo(d, i)
		if err != nil {
			return out, fmt.Errorf("cuda: device %d: %w", i, err)
		}
		out = append(out, dev)
	}
	return out, nil
}

// deviceInfo queries device i. Free memory needs a context: the device's
// primary context is retained for the query and released after.
func deviceInfo(d *driverAPI, i int) (Device, error) {
	info := Device{Index: i, Driver: versionString(d.version)}
	var dev int32
	if r := d.cuDeviceGet(&dev, int32(i)); r != 0 {
		return info, d.err(r)
	}
	info.Name = deviceName(d, dev)
	for _, a := range []struct {
		attr int32
		dst  *int
	}{{attrCCMajor, &info.Major}, {attrCCMinor, &info.Minor}, {attrMultiprocessors, &info.SMs}, {attrL2Bytes, &info.L2Bytes}} {
		var v int32
		if r := d.cuDeviceGetAttribute(&v, a.attr, dev); r != 0 {
			return info, fmt.Errorf("attribute %d: %w", a.attr, d.err(r))
		}
		*a.dst = int(v)
	}
	if r := d.cuDeviceTotalMem(&info.TotalBytes, dev); r != 0 {
		return info, d.err(r)
	}
	var ctx uintptr
	if r := d.cuDevicePrimaryCtxRetain(&ctx, dev); r != 0 {
		return info, fmt.Errorf("cuDevicePrimaryCtxRetain: %w", d.err(r))
	}
	defer d.cuDevicePrimaryCtxRelease(dev)
	if r := d.cuCtxSetCurrent(ctx); r != 0 {
		return info, fmt.Errorf("cuCtxSetCurrent: %w", d.err(r))
	}
	var total uint64
	if r := d.cuMemGetInfo(&info.FreeBytes, &total); r != 0 {
		return info, fmt.Errorf("cuMemGetInfo: %w", d.err(r))
	}
	return info, nil
}

func deviceName(d *driverAPI, dev int32) string {
	var name [256]byte
	if d.cuDeviceGetName(&name[0], int32(len(name)), dev) != 0 {
		return "unknown device"
	}
	if i := bytes.IndexByte(name[:], 0); i >= 0 {
		return string(name[:i])
	}
	return string(name[:])
}

// NVRTC reports the version of the NVRTC library New would compile the
// kernels with, or why none can be loaded.
func NVRTC() (string, error) {
	d, err := loadDriver()
	if err != nil {
		return "", err
	}
	n, err := loadNVRTC(d.version)
	if err != nil {
		return "", err
	}
	return versionString(n.version), nil
}

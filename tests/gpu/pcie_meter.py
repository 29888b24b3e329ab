"""The bytes that crossed a GPU's PCIe link, measured rather than estimated:
NVML's byte counters of the link (nvmlDeviceGetFieldValues with
NVML_FI_DEV_PCIE_COUNT_RX_BYTES / _TX_BYTES: counted by the GPU, from the
GPU's side: RX to the device, TX to the host), read by a thread every 10 ms
so that a counter narrower than 64 bits is followed across its wraps. Each
direction on its own: a kernel reading pinned host memory moves bytes to the
device, writing it moves them to the host, and the link carries both at once.
For the GPU runs' PCIe-limit figures, beside gmem's own estimate
(host_access_bytes: the host bytes of every pool range each launch
referenced, an upper bound).

    meter = PcieMeter(0)                  # the device as NVML numbers it
    to_device, to_host = meter.bytes()    # since the meter started

or open_meter(), which says why on stderr and gives None where NVML cannot.
"""
import ctypes
import sys
import threading

NVML_FI_DEV_PCIE_COUNT_TX_BYTES = 197
NVML_FI_DEV_PCIE_COUNT_RX_BYTES = 198
# nvmlValueType_t: the counter's width
VALUE_BITS = {1: 32, 2: 64, 3: 64, 4: 64, 5: 32}


class FieldValue(ctypes.Structure):  # nvmlFieldValue_t
    _fields_ = [("fieldId", ctypes.c_uint), ("scopeId", ctypes.c_uint), ("timestamp", ctypes.c_longlong),
                ("latencyUsec", ctypes.c_longlong), ("valueType", ctypes.c_uint), ("nvmlReturn", ctypes.c_uint),
                ("value", ctypes.c_ulonglong)]


class PcieMeter:
    def __init__(self, index=0, period_s=0.01):
        self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self._nvml.nvmlInit_v2(), "nvmlInit_v2")
        self._device = ctypes.c_void_p()
        self._check(self._nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self._device)),
                    "nvmlDeviceGetHandleByIndex_v2")
        self._last, self._bits = self._read()  # fails here, not in the thread, where there are no counters
        self._period_s = period_s
        self._totals = [0, 0]  # to the device, to the host
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pcie-meter", daemon=True)
        self._thread.start()

    @staticmethod
    def _check(rc, call):
        if rc != 0:
            raise OSError(f"{call} failed with NVML error {rc}")

    def _read(self):
        """The counters now, (to the device, to the host), and their widths."""
        fields = (FieldValue * 2)()
        fields[0].fieldId, fields[1].fieldId = NVML_FI_DEV_PCIE_COUNT_RX_BYTES, NVML_FI_DEV_PCIE_COUNT_TX_BYTES
        self._check(self._nvml.nvmlDeviceGetFieldValues(self._device, 2, fields), "nvmlDeviceGetFieldValues")
        for f in fields:
            self._check(f.nvmlReturn, f"nvmlDeviceGetFieldValues field {f.fieldId}")
        bits = [VALUE_BITS.get(f.valueType, 64) for f in fields]
        return [f.value & ((1 << b) - 1) for f, b in zip(fields, bits)], bits

    def _sample(self):
        with self._lock:  # reads in order: a later read never lands first
            now, _ = self._read()
            for i, (was, is_, bits) in enumerate(zip(self._last, now, self._bits)):
                self._totals[i] += (is_ - was) % (1 << bits)
            self._last = now

    def _run(self):
        while not self._stop.wait(self._period_s):
            self._sample()

    def bytes(self):
        """Bytes that crossed the link since the meter started: (to the
        device, to the host)."""
        self._sample()
        with self._lock:
            return tuple(self._totals)

    def close(self):
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()


def open_meter(index=0):
    """A PcieMeter of device `index`, or None (said on stderr) where NVML cannot give one."""
    try:
        return PcieMeter(index)
    except OSError as e:
        print(f"pcie_meter: PCIe bytes not measured: {e}", file=sys.stderr)
        return None

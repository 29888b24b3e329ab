"""The bytes that crossed a GPU's PCIe link, measured rather than estimated:
NVML's throughput counters (nvmlDeviceGetPcieThroughput: KB/s over the last
20 ms, each direction), read by a thread every 20 ms and summed over time.
Each direction on its own: a kernel reading pinned host memory moves bytes
to the device, writing it moves them to the host, and the link carries both
at once. For the GPU runs' PCIe-limit figures, beside gmem's
own estimate (host_access_bytes: the host bytes of every pool range each
launch referenced, an upper bound).

    meter = PcieMeter(0)      # device index as NVML numbers it
    to_device, to_host = meter.bytes()
    ...
    to_device2, to_host2 = meter.bytes()
"""
import ctypes
import threading
import time

NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1


class PcieMeter:
    def __init__(self, index=0, period_s=0.02):
        self._nvml = ctypes.CDLL("libnvidia-ml.so.1")
        self._check(self._nvml.nvmlInit_v2(), "nvmlInit_v2")
        self._device = ctypes.c_void_p()
        self._check(self._nvml.nvmlDeviceGetHandleByIndex_v2(index, ctypes.byref(self._device)),
                    "nvmlDeviceGetHandleByIndex_v2")
        self._rate()  # fails here, not in the thread, where the counters are missing
        self._period_s = period_s
        self._totals = [0.0, 0.0]  # to the device (RX), to the host (TX)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pcie-meter", daemon=True)
        self._thread.start()

    @staticmethod
    def _check(rc, call):
        if rc != 0:
            raise OSError(f"{call} failed with NVML error {rc}")

    def _rate(self):
        """Bytes per second over PCIe now: to the device, to the host."""
        rates = []
        for counter in (NVML_PCIE_UTIL_RX_BYTES, NVML_PCIE_UTIL_TX_BYTES):
            kb_per_s = ctypes.c_uint()
            self._check(self._nvml.nvmlDeviceGetPcieThroughput(self._device, counter, ctypes.byref(kb_per_s)),
                        "nvmlDeviceGetPcieThroughput")
            rates.append(kb_per_s.value * 1024)
        return rates

    def _run(self):
        last = time.perf_counter()
        while not self._stop.wait(self._period_s):
            rates = self._rate()
            now = time.perf_counter()
            with self._lock:
                for i, rate in enumerate(rates):
                    self._totals[i] += rate * (now - last)
            last = now

    def bytes(self):
        """Bytes that crossed the link since the meter started, (to the
        device, to the host); read after a 40 ms wait, as each sample covers
        the 20 ms before it."""
        time.sleep(2 * self._period_s)
        with self._lock:
            return tuple(self._totals)

    def close(self):
        self._stop.set()
        self._thread.join()
        self._nvml.nvmlShutdown()

"""The sidecar: journal reader, time-accounting engine and its views. Never imports torch or NVRx."""

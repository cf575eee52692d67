"""Pictures: attention heatmaps from the real model forward, and training curves from the metrics log.

matplotlib is an optional extra (`pip install 'tfcli[plot]'`); it is imported only when a picture is drawn.
"""

"""MSVE calibration: leave-one-out block effects on recorded trees and the weight fit ``policy=arbor`` reads."""

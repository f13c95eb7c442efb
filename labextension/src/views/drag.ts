// A mouse drag, followed on the window until the button is let go.

/**
 * Call `move` on each mouse move and `up` once when the button is let go, wherever the pointer
 * is; returns a function that stops following (for a view disposed mid-drag).
 */
export function followDrag(move: (ev: MouseEvent) => void, up: (ev: MouseEvent) => void): () => void {
  const onUp = (ev: MouseEvent) => {
    stop();
    up(ev);
  };
  const stop = () => {
    window.removeEventListener('mousemove', move);
    window.removeEventListener('mouseup', onUp);
  };
  window.addEventListener('mousemove', move);
  window.addEventListener('mouseup', onUp);
  return stop;
}

// One notebook's channel to its kernel's jupyter_gpumem: the comm of `COMM_TARGET`.
//
// The kernel opens a comm at `%load_ext` (its data: the whole state); the channel takes it
// through the registered target. A notebook that opens on a kernel already loaded finds that
// comm with `comm_info` (asked once, when the kernel is ready) and attaches to it, saying
// "hello" (the kernel answers with the state). If the comm is closed by anyone but the
// kernel's unload (another frontend without this extension closes a comm of a target it does
// not know), the channel opens a comm of its own, which the kernel's target accepts. While a
// cell runs the kernel pushes; the channel never asks anything of a busy kernel.
import type { ISessionContext } from '@jupyterlab/apputils';
import type { Kernel, KernelMessage } from '@jupyterlab/services';
import { type ISignal, Signal } from '@lumino/signaling';
import { COMM_TARGET, type KernelMessage as GpuMessage, readMessage } from './schema';

/**
 * Where the channel stands: no kernel; a kernel without jupyter_gpumem loaded (or not known
 * yet); attached to its comm; the extension unloaded.
 */
export type ChannelStatus = 'no-kernel' | 'waiting' | 'connected' | 'unloaded';

type Comm = Kernel.IComm;

/** The comm of one notebook's kernel (see the file's head); `received` has its messages. */
export class KernelChannel {
  private readonly _received = new Signal<this, GpuMessage>(this);
  private readonly _statusChanged = new Signal<this, ChannelStatus>(this);
  private _status: ChannelStatus = 'no-kernel';
  private comm: Comm | null = null;
  private kernel: Kernel.IKernelConnection | null = null;
  private restarting = false;
  private disposed = false;
  private readonly onOpen = (comm: Comm, msg: KernelMessage.ICommOpenMsg): void => {
    this.attach(comm);
    this.deliver(msg.content.data);
  };

  constructor(private readonly context: ISessionContext) {
    context.kernelChanged.connect(this.onKernelChanged, this);
    context.statusChanged.connect(this.onKernelStatus, this);
    this.follow(context.session?.kernel ?? null);
  }

  /** Every message from the kernel, checked (`schema.readMessage`). */
  get received(): ISignal<this, GpuMessage> {
    return this._received;
  }

  get statusChanged(): ISignal<this, ChannelStatus> {
    return this._statusChanged;
  }

  get status(): ChannelStatus {
    return this._status;
  }

  get isDisposed(): boolean {
    return this.disposed;
  }

  dispose(): void {
    if (this.disposed) {
      return;
    }
    this.disposed = true;
    this.context.kernelChanged.disconnect(this.onKernelChanged, this);
    this.context.statusChanged.disconnect(this.onKernelStatus, this);
    this.follow(null);
    Signal.clearData(this);
  }

  private setStatus(status: ChannelStatus): void {
    if (status !== this._status) {
      this._status = status;
      this._statusChanged.emit(status);
    }
  }

  private onKernelChanged(_: ISessionContext, change: { newValue: Kernel.IKernelConnection | null }): void {
    this.follow(change.newValue);
  }

  /** Listen to `kernel` (null: none): its target, and its comm if jupyter_gpumem is loaded. */
  private follow(kernel: Kernel.IKernelConnection | null): void {
    if (kernel === this.kernel && kernel !== null) {
      return; // told again of the kernel it follows
    }
    if (this.kernel && !this.kernel.isDisposed) {
      this.kernel.removeCommTarget(COMM_TARGET, this.onOpen);
    }
    // our side only: the comm stays open for the kernel and any other notebook on it
    this.comm?.dispose();
    this.comm = null;
    this.kernel = kernel;
    if (!kernel || !kernel.handleComms) {
      this.setStatus('no-kernel');
      return;
    }
    this.setStatus('waiting');
    kernel.registerCommTarget(COMM_TARGET, this.onOpen);
    void this.find(kernel);
  }

  /** Ask once whether the kernel has our comm open (jupyter_gpumem loaded); attach to it. */
  private async find(kernel: Kernel.IKernelConnection): Promise<void> {
    let ids: string[] = [];
    try {
      const reply = await kernel.requestCommInfo({ target_name: COMM_TARGET });
      if (reply.content.status === 'ok') {
        ids = Object.keys(reply.content.comms);
      }
    } catch {
      return; // the kernel went away meanwhile
    }
    if (kernel !== this.kernel || this.comm || ids.length === 0 || kernel.isDisposed) {
      return;
    }
    const comm = kernel.createComm(COMM_TARGET, ids[0]);
    this.attach(comm);
    comm.send({ type: 'hello' });
  }

  private attach(comm: Comm): void {
    if (this.comm && this.comm !== comm) {
      this.comm.dispose(); // a newer comm (a reload of the extension): it is the one now
    }
    this.comm = comm;
    comm.onMsg = msg => this.deliver(msg.content.data);
    comm.onClose = msg => this.closed(comm, msg.content.data as { reason?: unknown } | undefined);
    this.setStatus('connected');
  }

  private deliver(data: unknown): void {
    const message = readMessage(data);
    if (message) {
      this._received.emit(message);
    }
  }

  private closed(comm: Comm, data: { reason?: unknown } | undefined): void {
    if (comm !== this.comm) {
      return;
    }
    this.comm = null;
    const kernel = this.kernel;
    if (data?.reason === 'unload' || !kernel || kernel.isDisposed) {
      this.setStatus('unloaded');
      return;
    }
    // closed by another frontend: open a comm of our own (the kernel's target takes it)
    try {
      const own = kernel.createComm(COMM_TARGET);
      this.attach(own);
      own.open({ type: 'hello' });
    } catch {
      this.setStatus('waiting');
    }
  }

  private onKernelStatus(_: ISessionContext, status: Kernel.Status): void {
    if (status === 'restarting' || status === 'autorestarting' || status === 'dead') {
      this.restarting = true;
      this.comm = null; // JupyterLab disposes the comms of a restarted kernel
      this.setStatus(status === 'dead' ? 'no-kernel' : 'waiting');
    } else if (status === 'idle' && this.restarting && this.kernel) {
      this.restarting = false;
      void this.find(this.kernel); // a new kernel: loaded again only by %load_ext
    }
  }
}
